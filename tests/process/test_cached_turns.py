"""Known answer for issue 32's cached agentic turns, on the fake llama-server (real cache semantics): a configuration
that prefills 4x faster and decodes at half the speed wins every cold prompt measured and loses the cached turns
that add few tokens. Both go through the study's cold stage in rounds of fresh servers, which measures the cached
turns after the cold samples; every cached sample proves its context came from the slot's cache (cache_n), and the
report gives the crossover in new tokens per turn.

Per turn of R = 32 response tokens: fast-prefill N/4000 + 32/50 s, fast-decode N/1000 + 32/100 s, equal at N = 427
new tokens (the fake's prefill does not slow with depth).
"""

from __future__ import annotations

import re
from pathlib import Path

from fakes.llama_server import fake_config
from xover.domain.config import LlamaConfig
from xover.domain.records import cached_depth
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import Binaries
from xover.measure.cold import stage_ttft
from xover.measure.study import StageEvent, Study
from xover.report.html import build_report, render_markdown
from xover.results.read_model import load

RESPONSE = 32
DEPTH = 1024
NEW = (128, 256, 1024)
CROSSING = 427  # N / 4000 + 32 / 50 = N / 1000 + 32 / 100


def test_cached_turns_cross_in_new_tokens_where_cold_prompts_do_not(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    prefill, decode = fake_config("fast prefill", 4000, 50), fake_config("fast decode", 1000, 100)
    spec = StudySpec(
        configs=(prefill, decode),
        model_preset="tiny-moe",
        lengths=(1024, 2048),
        response_tokens=(RESPONSE,),
        decode_tokens=RESPONSE,
        repetitions=1,
        rounds=3,
        max_rounds=3,
        cached_new_tokens=NEW,
        cached_depth=DEPTH,
    )
    events: list[StageEvent] = []
    study = Study(spec, tiny_model, fake_bins, tmp_path / "study", frozenset(), ("test",), events.append)
    assert stage_ttft(study, [(prefill.name, decode.name)]) == 0, [e.detail for e in events if e.status == "fail"]
    data = load(tmp_path / "study")
    cached = [row.sample for row in data.ttft_rows if cached_depth(row.sample.mode) is not None]
    # every turn size, in every round, on both: each proven to come from the slot's cache
    assert sorted((s.length, s.round) for s in cached if s.counted_cached) == sorted(
        (n, r) for n in NEW for r in (1, 2, 3) for _ in range(2)
    )
    assert all(s.timings is not None and (s.timings.cache_n, s.timings.prompt_n) == (DEPTH, s.length) for s in cached)
    report = build_report(data, response=RESPONSE, n_boot=0)
    cold = next(v for v in report.verdicts if v.startswith("fast prefill vs fast decode:"))
    assert "fast prefill is faster at every measured length" in cold, cold
    told = next(v for v in report.verdicts if "on cached turns" in v)
    m = re.search(r"fast decode is faster for turns of fewer than ~([\d,]+) new tokens and fast prefill for more", told)
    assert m is not None, told
    assert 0.7 * CROSSING < int(m.group(1).replace(",", "")) < 1.4 * CROSSING
    assert "1K-token context in the cache" in told and "3 rounds of fresh servers" in told
    # which to run: fast prefill for every cold prompt, fast decode for the turns below the crossing (128, 256 new
    # tokens: 0.45 s and 0.58 s against 0.67 s and 0.70 s), fast prefill above it (1K: 0.90 s against 1.34 s)
    work = next(v for v in report.verdicts if v.startswith("Which to run for which kind of work"))
    assert work.endswith(
        "cold prompts: 1K-2K fast prefill; cached turns on a 1K-token context: 128-256 new tokens fast decode, "
        "1K new tokens fast prefill."
    ), work
    md = render_markdown(report)
    assert "## Cached agentic turns" in md
    rows = [line for line in md.splitlines() if line.startswith("| fast decode | 128 |")]
    assert len(rows) == 1 and "| 3 |" in rows[0]
    assert re.search(r"\| \d+\.\d \(\d+\.\d-\d+\.\d\) \|", rows[0]), rows[0]  # the decode rate with its range


def test_the_turns_decode_is_checked_against_llama_bench_at_the_same_depth(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    """Where llama-bench measured tg at the cached depth, the section sets it beside the turns' decode: the fake
    server decodes at 100 t/s, so a llama-bench record of 98 t/s agrees and one of 150 t/s is called off by +50%."""
    from xover.domain.records import BenchResult
    from xover.results.store import Store

    a, b = fake_config("a", 4000, 100), fake_config("b", 4000, 100)
    spec = StudySpec(
        configs=(a, b),
        model_preset="tiny-moe",
        lengths=(1024,),
        response_tokens=(RESPONSE,),
        repetitions=1,
        rounds=2,
        max_rounds=2,
        cached_new_tokens=(128,),
        cached_depth=DEPTH,
    )
    study = Study(spec, tiny_model, fake_bins, tmp_path / "study", frozenset(), ("test",), lambda e: None)
    assert stage_ttft(study, []) == 0
    model_key = load(tmp_path / "study").ttft_rows[0].model_key
    with Store(tmp_path / "study") as store:
        run = store.begin_run("bench", ["test"], store.provenance(store.runs()[0]["id"]))
        for config, rate in ((a, 98.0), (b, 150.0)):
            key = store.put_config(config)
            store.add_bench_result(run, model_key, BenchResult(key, 0, 32, DEPTH, (1,), (rate,), rate, 0.0, {}))
        store.add_bench_result(run, model_key, BenchResult(key, 0, 32, 0, (1,), (999.0,), 999.0, 0.0, {}))
        store.end_run(run, "done")
    md = render_markdown(build_report(load(tmp_path / "study"), response=RESPONSE, n_boot=0))
    section = md.split("## Cached agentic turns", 1)[1].split("\n## ", 1)[0]
    assert "llama-bench's tg at the same depth (1K tokens)" in section
    (line_a,) = [ln for ln in section.splitlines() if ln.startswith("- a: ")]
    (line_b,) = [ln for ln in section.splitlines() if ln.startswith("- b: ")]
    assert "llama-bench 98.0 t/s: they agree" in line_a, line_a
    assert re.search(r"llama-bench 150\.0 t/s: llama-bench \+\d+% off the turns' median", line_b), line_b


def test_cached_turns_the_cold_samples_put_over_max_ttft_are_planned_out_with_a_note() -> None:
    """A configuration that prefills 1K cold in 20 s cannot take an 8K-token turn under a 60 s max-ttft (its prefill
    alone about 160 s): round 2 plans the 512 and 1K turns it still lacks, not the 8K one, and says why, so no
    server is started for turns it would only skip."""
    from xover.domain.records import ServerTimings, TtftSample
    from xover.measure.resume import ttft_todo
    from xover.results.read_model import StoredSample

    slow = LlamaConfig("slow")
    spec = StudySpec(
        configs=(slow,),
        model_preset="tiny-moe",
        lengths=(1024,),
        response_tokens=(RESPONSE,),
        repetitions=1,
        max_ttft_s=60.0,
        cached_new_tokens=(512, 1024, 8192),
        cached_depth=DEPTH,
    )

    def sample(round: int) -> StoredSample:
        s = TtftSample(
            slow.key, "cold", 1024, 0, "p", 0, None, 20 * 10**9, 21 * 10**9, (), 1,
            ServerTimings(0, 1024, 20_000.0, 51.2, 8, 100.0, 80.0), True, round=round,
        )  # fmt: skip
        return StoredSample(1, 1, "slow", s, "mk")

    (todo,) = ttft_todo(spec, [sample(1)], "mk", 2)
    assert todo.missing == {1024: 1} and todo.turns == {"cached": {512: 1, 1024: 1}}
    assert any("cached turns of 8,192 new tokens not measured" in n and "about 160 s" in n for n in todo.notes)
