"""Known answers for rounds of fresh servers under a drifting machine (issue 30), on the fake llama-server (its rates
slow down with wall time, the same for every process: `--fake-drift-per-s`): the study's real cold TTFT stage
(xover.measure.cold) and verdict rules (xover.analysis.crossover, xover.analysis.rounds).

(a) Two identical configurations: measured the old way, one server each, one after the other, the drift shows as a
    difference, which the within-process rule takes for a winner unless a stall of the machine hid it; measured in
    interleaved rounds, they are indistinguishable.
(b) A planted 15% difference under a drift (a gentler one) is named, with its interval.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from fakes.llama_server import fake_config
from xover.analysis.crossover import compare_pair, separation
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import Binaries
from xover.measure.cold import stage_ttft
from xover.measure.study import StageEvent, Study
from xover.report.html import build_report, render_markdown
from xover.results.read_model import crossover_inputs, load

LENGTH = 512
RESPONSE = 16
DRIFT = 0.05  # the fake machine slows down by 5 % a second: a server started a second later is 5 % slower
# (b): the rounds rule pairs A with B inside each round, so what the drift does between A's server and B's (started a
# second or two later) is spread between rounds, alternating with the ABBA order: at 5 % a second it put the interval
# of a planted 15 % within 5 % of 1. And with one sample a round, one stall of this 2-core machine (100 ms and more)
# moved a round's ratio by 20 %, undoing the verdict. So (b) drifts at 2 % a second and takes 3 samples in each
# server: a round's median is then what its server measured, whichever one sample a stall hit.
PLANTED_DRIFT, PLANTED_REPETITIONS = 0.02, 3
# a turn of about 0.4 s (512 tokens at 2,000 t/s, 16 at 100 t/s): long enough that the fake's own overheads are small
# beside it, and that one configuration's samples take long enough for the drift to show (a stall of this 2-core
# machine, 100 ms and more, is not small beside it: what a test asserts holds whichever sample one hits)
PREFILL, DECODE = 2000, 100


def _config(name: str, prefill_tps: float, decode_tps: float, epoch: float, drift_per_s: float = DRIFT) -> LlamaConfig:
    """A configuration of the fake server that drifts from ``epoch`` on; ``name`` tags it apart."""
    drift = ("--fake-drift-per-s", f"{drift_per_s:g}", "--fake-drift-epoch", f"{epoch:.3f}")
    return fake_config(name, prefill_tps, decode_tps, *drift)


def _stage(configs: tuple[LlamaConfig, ...], study: Path, bins: Binaries, model: Path, **rounds: int) -> None:
    spec = StudySpec(
        configs=configs,
        model_preset="tiny-moe",
        lengths=(LENGTH,),
        response_tokens=(RESPONSE,),
        **rounds,  # type: ignore[arg-type]
    )
    events: list[StageEvent] = []
    st = Study(spec, model, bins, study, frozenset(), ("test",), events.append)
    assert stage_ttft(st, [(configs[0].name, configs[1].name)]) == 0, [e.detail for e in events if e.status == "fail"]


def test_identical_configurations_under_drift(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    epoch = time.time()
    a, b = _config("a", PREFILL, DECODE, epoch), _config("b", PREFILL, DECODE, epoch)
    # the old design: one server per configuration, A's four samples then B's
    _stage((a, b), tmp_path / "old", fake_bins, tiny_model, repetitions=4, rounds=1, max_rounds=1)
    old = {c.label: dataclasses.replace(c, rounds={}) for c in crossover_inputs(load(tmp_path / "old"))}
    # The drift makes b, measured after a, slower: b's fastest sample (its first) is slower than a's fastest, since a
    # stall of the machine only adds time and would have to hit every one of a's samples to undo it.
    assert min(old["b"].ttft_s[LENGTH]) > min(old["a"].ttft_s[LENGTH])
    # The within-process rule (every sample of one total beats every sample of the other's) takes that for "a is
    # faster": the drift parts a's slowest sample from b's fastest by some 30 ms, so a stall of that much in one of
    # a's samples leaves it "within noise" instead. It never names b, whose samples all come later.
    assert separation(old["a"], old["b"], LENGTH, RESPONSE) in (-1, 0)
    # the new design: four interleaved rounds of fresh servers, one sample each
    _stage((a, b), tmp_path / "new", fake_bins, tiny_model, repetitions=1, rounds=4, max_rounds=4)
    data = load(tmp_path / "new")
    new = {c.label: c for c in crossover_inputs(data)}
    assert sorted(new["a"].rounds[LENGTH]) == [1, 2, 3, 4] == sorted(new["b"].rounds[LENGTH])
    pair = compare_pair(new["a"], new["b"], RESPONSE, n_boot=0)
    (interval,) = pair.intervals
    assert interval is not None and interval.low < 1 < interval.high and pair.separated == (0,)
    md = render_markdown(build_report(data, response=RESPONSE, n_boot=0))
    assert "indistinguishable here at every measured length" in md and "4 rounds of fresh servers" in md
    # the first configuration measured once more, in a fresh server, at the end of the stage: kept apart from its
    # rounds (round -4), slower than their median, as the machine drifted
    ((label, again),) = data.drift_samples()
    assert label == "a" and again.round == -4 and again.first_token_ns is not None
    assert again.first_token_ns / 1e9 > statistics.median(t for t, _ in new["a"].rounds[LENGTH].values())


def test_a_planted_difference_under_drift_is_named_with_its_interval(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    epoch = time.time()
    fast = _config("fast", PREFILL, DECODE, epoch, PLANTED_DRIFT)
    slow = _config("slow", PREFILL * 0.85, DECODE * 0.85, epoch, PLANTED_DRIFT)
    _stage((fast, slow), tmp_path, fake_bins, tiny_model, repetitions=PLANTED_REPETITIONS, rounds=4, max_rounds=4)
    configs = {c.label: c for c in crossover_inputs(load(tmp_path))}
    pair = compare_pair(configs["fast"], configs["slow"], RESPONSE, n_boot=0)
    (interval,) = pair.intervals
    assert pair.separated == (-1,) and interval is not None and interval.high < 1
    assert interval.low < 0.85 < interval.high or abs(interval.ratio - 0.85) < 0.05  # the planted 15 %
    assert interval.describe("fast", "slow").startswith("fast faster than slow: fast takes 0.8")


def test_the_budget_stops_added_rounds_and_the_drift_check(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    """Past the study's rounds, another round is measured only where a question is open and the budget holds it; the
    drift check likewise (a lease ended the H200 engines study mid-round: what runs past the budget can be cut). Two
    identical configurations keep their question open, so only the budget stops them."""
    epoch = time.time()
    a, b = _config("a", PREFILL, DECODE, epoch), _config("b", PREFILL, DECODE, epoch)
    events: list[StageEvent] = []

    def stage(study: Path, budget_s: float | None) -> None:
        spec = StudySpec(
            configs=(a, b), model_preset="tiny-moe", lengths=(LENGTH,), response_tokens=(RESPONSE,), repetitions=1,
            rounds=2, max_rounds=3, budget_s=budget_s,
        )  # fmt: skip
        st = Study(spec, tiny_model, fake_bins, study, frozenset(), ("test",), events.append)
        assert stage_ttft(st, [("a", "b")]) == 0

    stage(tmp_path / "tight", 0.01)  # any round's servers take longer than this
    data = load(tmp_path / "tight")
    assert sorted({s.round for _, s in data.cold_samples()}) == [1, 2] and not data.drift_samples()
    said = [e.detail for e in events if e.status == "info"]
    assert any(
        d.startswith("round 3: not measured, the study's budget of 0 s would run out (open: a, b)") for d in said
    )
    assert "drift check: not measured, the study's budget of 0 s would run out" in said
    events.clear()
    stage(tmp_path / "ample", None)
    data = load(tmp_path / "ample")
    assert sorted({s.round for _, s in data.cold_samples()}) == [1, 2, 3]
    assert [s.round for _, s in data.drift_samples()] == [-3]
