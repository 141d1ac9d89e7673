"""Your own turns (issue 48 item 4): a recording's turns sized into a study and answered in minutes of waiting, on
constructed data with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from xover.analysis.crossover import ConfigData, CostModel
from xover.analysis.your_turns import (
    RecordedTurn,
    recorded_turns,
    replay_check,
    round_models,
    saving,
    saving_line,
    study_sizes,
    summarize,
    turn_wait,
    waiting,
)

MODEL = CostModel(a=0.05, b=1e-4, c=1e-9, p=0.01, q=1e-7)  # 0.05 s + 0.1 ms a token + attention; 100 t/s decode


def test_a_cached_turn_waits_for_its_new_tokens_over_the_whole_context() -> None:
    cold, cached = RecordedTurn(10_000, 0, 200), RecordedTurn(12_000, 10_000, 200)
    assert turn_wait(MODEL, cold) == pytest.approx(MODEL.ttft(10_000) + MODEL.decode_s(10_000, 200))
    # 2,000 new tokens, attending over 10K-12K positions: far less than the 12K prompt sent cold
    prefill = 0.05 + 1e-4 * 2000 + 1e-9 * (12_000**2 - 10_000**2)
    assert turn_wait(MODEL, cached) == pytest.approx(prefill + MODEL.decode_s(12_000, 200))
    assert turn_wait(MODEL, cached) < turn_wait(MODEL, RecordedTurn(12_000, 0, 200))


def test_recorded_objects_become_turns_and_sizes() -> None:
    recorded = [{"prompt_tokens": 3000, "cached_tokens": 0, "answer_tokens": 100}, None, {"prompt_tokens": 0},
                *({"prompt_tokens": 3000 + 1000 * i, "cached_tokens": 2900 + 1000 * (i - 1), "answer_tokens": 150}
                  for i in range(1, 21))]  # fmt: skip
    turns = recorded_turns(recorded)
    assert len(turns) == 21 and turns[0] == RecordedTurn(3000, 0, 100) and turns[1].new == 1100
    s = summarize(turns)
    assert (s.turns, s.cold, s.answer.median, s.prompt.high) == (21, 1, 150, 23_000)
    sizes = study_sizes(turns)
    assert sizes.lengths == (3072, 13_056, 23_040)  # shortest, median, longest context, up to 256 tokens
    assert sizes.cached_new_tokens == (1280,) and sizes.cached_depth == 12_544 and sizes.response_tokens == 150


def test_a_workload_of_one_length_still_gets_three_lengths() -> None:
    sizes = study_sizes([RecordedTurn(4096, 0, 64)] * 5)
    assert sizes.lengths == (1024, 2048, 4096) and sizes.cached_new_tokens == () and sizes.cached_depth is None
    assert len(study_sizes([RecordedTurn(100, 0, 8)]).lengths) == 3


def test_each_rounds_model_is_fitted_to_that_rounds_medians() -> None:
    lengths = (1024, 8192, 32_768)
    rounds = {L: {r: (MODEL.ttft(L) * (1 + 0.1 * r), 1 / (MODEL.p + MODEL.q * L)) for r in (1, 2, 3)} for L in lengths}
    config = ConfigData("x", {L: [MODEL.ttft(L)] for L in lengths}, {L: [100.0] for L in lengths}, rounds=rounds)
    models = round_models(config)
    assert sorted(models) == [1, 2, 3]
    assert models[2].ttft(5000) == pytest.approx(MODEL.ttft(5000) * 1.2, rel=1e-6)
    assert models[1].decode_s(5000, 10) == pytest.approx(MODEL.decode_s(5000, 10), rel=1e-6)


def test_the_saving_is_an_interval_over_paired_rounds() -> None:
    a = {1: 600.0, 2: 630.0, 3: 615.0}
    b = {1: 480.0, 2: 500.0, 3: 490.0}
    s = saving("cpu12", a, "gpu", b, 40)
    assert s is not None and s.rounds == 3 and s.separated == 1  # b waits less: a's difference is positive
    diffs = [120.0, 130.0, 125.0]
    half = 4.303 * 5.0 / math.sqrt(3)
    assert s.diff_s == pytest.approx(125.0) and (s.low_s, s.high_s) == pytest.approx((125 - half, 125 + half))
    line = saving_line(s)
    assert line.startswith("Over your 40 recorded turns, cpu12 would have kept you waiting 10.2 min and gpu 8.2 min")
    assert "gpu saves 2.1 min against cpu12 (95% interval" in line and sum(diffs) == 375
    noisy = saving("x", {1: 100.0, 2: 200.0, 3: 120.0}, "y", {1: 150.0, 2: 140.0, 3: 150.0}, 5)
    assert noisy is not None and noisy.separated == 0 and "indistinguishable here" in saving_line(noisy)
    # two rounds decide nothing, however far apart: "not yet compared", never "indistinguishable"
    short = saving("x", {1: 100.0, 2: 200.0}, "y", {1: 1500.0, 2: 1400.0}, 5)
    assert short is not None and short.separated == 0 and short.rounds == 2
    assert "not yet compared (2 rounds of fresh servers, fewer than the 3" in saving_line(short)
    assert "; x ahead by " in saving_line(short)  # x waits less in both rounds
    assert "indistinguishable" not in saving_line(short)
    assert saving("x", {1: 1.0}, "y", {1: 2.0}, 1) is None  # one shared round: no interval


def test_waiting_sums_every_turn_per_round_and_the_replay_is_checked_against_it() -> None:
    turns = [RecordedTurn(4000, 0, 50), RecordedTurn(6000, 4000, 50)]
    w = waiting({1: MODEL, 2: MODEL}, turns)
    assert w[1] == w[2] == pytest.approx(sum(turn_wait(MODEL, t) for t in turns))
    check = replay_check("gpu", MODEL, [(t, turn_wait(MODEL, t) * 1.1) for t in turns])
    assert check.turns == 2 and check.off == pytest.approx(1 / 1.1 - 1)


def test_the_spec_names_a_workload_and_leaves_its_sizes_to_it(tmp_path: Path) -> None:
    from xover.domain.study_spec import spec_from_dict
    from xover.errors import XoverError

    doc = {"model": {"preset": "tiny-moe"}, "study": {"workload": "rec.jsonl"}, "config": [{"name": "a"}]}
    assert spec_from_dict(doc, base_dir=tmp_path).workload == tmp_path / "rec.jsonl"
    for key, value in (("lengths", [1024]), ("cached-turns", [512]), ("response-tokens", 64)):
        bad = {**doc, "study": {"workload": "rec.jsonl", key: value}}
        with pytest.raises(XoverError, match=f"\\[study\\] {key} is drawn from the workload's turns"):
            spec_from_dict(bad, base_dir=tmp_path)
    with pytest.raises(XoverError, match="workload must be the path of a recording"):
        spec_from_dict({**doc, "study": {"workload": 3}})


def test_a_recordings_kind_and_timings_are_read_from_its_lines() -> None:
    from xover.domain.turn_shape import recorded_of

    full = '{"format":"xover-session/1"}\n{"turn":0,"messages":[],"recorded":{"prompt_tokens":9}}\n'
    shape = '{"turn":0,"shape":[],"recorded":{"prompt_tokens":9}}\n{"event":"request","recorded":{}}\n'
    log = '{"format":"xover-session/1","recorder":{"from_log":"s.log"}}\n{"turn":0,"shape":[]}\n'
    assert recorded_of(full) == ("full", [{"prompt_tokens": 9}])
    assert recorded_of(shape) == ("shape-only", [{"prompt_tokens": 9}])
    assert recorded_of(log) == ("log", [None])
