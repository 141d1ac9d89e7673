"""The read model: one load of a study directory gives every reader (report, export, audit, a resumed study)
the stored records, typed, with their place in the store."""

import dataclasses
import datetime
import json
from pathlib import Path

import pytest

from fakes.records import provenance
from xover.domain.config import LlamaConfig, from_server_record
from xover.domain.records import BenchResult, Failure, ServerTimings, TtftSample
from xover.domain.study_spec import StudySpec
from xover.errors import XoverError
from xover.measure.study import missing_ttft
from xover.report.rounds import left_out_line
from xover.results.read_model import (
    SESSION_GAP_S,
    Artifact,
    StoredRun,
    StoredSample,
    StudyData,
    bench_data,
    crossover_inputs,
    load,
)
from xover.results.store import Store


def _sample(key: str, length: int, rep: int, ok: bool = True) -> TtftSample:
    t = ServerTimings(
        cache_n=0,
        prompt_n=length,
        prompt_ms=50.5,
        prompt_per_second=20277.0,
        predicted_n=16,
        predicted_ms=8.0,
        predicted_per_second=2000.0,
    )
    return TtftSample(key, "cold", length, rep, f"p{rep}", 1, 100, 51_000_000, 60_000_000, (51_000_000,), 16, t, ok)


def test_one_load_gives_typed_rows_and_the_views_of_every_reader(tmp_path):
    cfg = LlamaConfig("ncmoe=12", settings=(("n-cpu-moe", "12"),))
    other = LlamaConfig("ncmoe=18", settings=(("n-cpu-moe", "18"),))
    scfg = cfg  # measured by llama-server too: one configuration, one key
    res = BenchResult(cfg.key, 512, 0, 4000, (1_000_000,), (512.0,), 512.0, 0.0, {"avg_ts": 512.0})
    with Store(tmp_path) as st:
        run = st.begin_run("bench", ["xover", "bench"], provenance())
        for c in (cfg, other, scfg):
            st.put_config(c)
        st.add_bench_result(run, "mk", res)
        st.add_failure(run, Failure(other.key, "bench", "pp512 @ d4000", "exit 1", "oom"))
        st.add_failure(run, Failure("f" * 16, "server-start", "-", "no port", ""))  # a configuration never stored
        st.add_ttft_sample(run, "mk", _sample(scfg.key, 1024, 0))
        st.add_ttft_sample(run, "mk", _sample(scfg.key, 4096, 0))
        st.add_artifact(None, "prediction", {"created_unix_ns": 1})
        st.add_artifact(run, "prediction", {"created_unix_ns": 2})
        st.end_run(run, "done")
    data = load(tmp_path)
    assert data.configs == (cfg, other) and data.labels == {cfg.key: "ncmoe=12", other.key: "ncmoe=18"}
    (r,) = data.runs
    assert isinstance(r, StoredRun) and (r.kind, r.status, r.command) == ("bench", "done", ("xover", "bench"))
    assert r.start_ns == r.started_unix_ns and data.provenances == [provenance()]
    assert data.artifacts[0] == Artifact(None, "prediction", {"created_unix_ns": 1}) and data.artifacts[1].run_id == run
    assert data.artifact_bodies("prediction") == [{"created_unix_ns": 1}, {"created_unix_ns": 2}]
    assert data.prediction() == {"created_unix_ns": 1}
    assert data.bench == (("ncmoe=12", res),) and data.bench_rows[0].model_key == "mk"
    assert [lb for lb, _ in data.ttft] == [s.label for s in data.ttft_rows] == ["ncmoe=12", "ncmoe=12"]
    assert [lb for lb, _ in data.failures] == ["ncmoe=18", "ffffffff"]  # an unknown configuration: its key's start
    assert [(s.row_id, s.run_id, s.model_key) for s in data.ttft_rows] == [(1, run, "mk"), (2, run, "mk")]
    assert [f.model_key for f in data.failure_rows] == [provenance().model.key] * 2  # type: ignore[union-attr]
    bench = bench_data(data)
    assert bench.configs == (cfg, other) and [f.failure.stage for f in bench.failures] == ["bench"]
    assert bench.model_names == {provenance().model.key: "m.gguf"}  # type: ignore[union-attr]
    assert bench_data(data, {cfg.key}).failures == () and bench_data(data, {other.key}).results == ()


def test_a_resumed_study_counts_the_stored_cold_samples_of_its_model_and_configuration(tmp_path):
    scfg = LlamaConfig("a")
    with Store(tmp_path) as st:
        run = st.begin_run("ttft", ["xover"], provenance())
        st.put_config(scfg)
        st.add_ttft_sample(run, "mk", _sample(scfg.key, 1024, 0))
        st.add_ttft_sample(run, "mk", _sample(scfg.key, 1024, 1, ok=False))  # failed its cold check: not counted
        st.add_ttft_sample(run, "other", _sample(scfg.key, 4096, 0))  # another model
        st.end_run(run, "done")
    spec = StudySpec(configs=(LlamaConfig(name="a"),), model_preset="tiny-moe", lengths=(1024, 4096), repetitions=2)
    rows = load(tmp_path).ttft_rows
    assert missing_ttft(rows, spec, "mk", scfg.key, fresh=False) == {1024: 1, 4096: 2}
    assert missing_ttft(rows, spec, "other", scfg.key, fresh=False) == {1024: 2, 4096: 1}
    assert missing_ttft(rows, spec, "mk", scfg.key, fresh=True) == {1024: 2, 4096: 2}
    assert missing_ttft(rows, spec, "mk", "another-config", fresh=False) == {1024: 2, 4096: 2}


def test_a_directory_without_a_store_is_named_with_the_commands_that_write_one(tmp_path):
    with pytest.raises(XoverError, match="written by xover bench/ttft/study"):
        load(tmp_path)
    with pytest.raises(XoverError, match="written by xover ttft, cache or study"):
        load(tmp_path, written_by="xover ttft, cache or study")
    assert list(tmp_path.iterdir()) == []


def test_a_rebuilt_report_prices_turns_as_the_study_did(tmp_path, monkeypatch) -> None:
    """The response lengths and band come from the latest ``study`` artifact (a study of 64-token responses is
    rebuilt with 64, not the CLI's old default of 200); a store without one has none, and the CLI falls back."""
    from xover.cli import main
    from xover.report import html

    with Store(tmp_path / "a") as store:
        store.add_artifact(None, "study", {"configs": [], "pairs": [], "response_tokens": [200], "band": [1, 2]})
        store.add_artifact(
            None, "study", {"configs": ["a"], "pairs": [], "response_tokens": [64, 128], "band": [500, 900]}
        )
    with Store(tmp_path / "b") as store:
        store.add_artifact(None, "stage-seconds", {"ttft": 1.0})
    assert load(tmp_path / "a").recorded_turns() == ((64, 128), (500, 900))
    assert load(tmp_path / "b").recorded_turns() is None
    asked: list[tuple[str, int, tuple[int, int]]] = []
    real = html.build_report

    def spy(data, response=200, band=(10_000, 40_000), n_boot=500):  # type: ignore[no-untyped-def]
        asked.append((data.study_dir.rsplit("/", 1)[-1], response, band))
        return real(data, response=response, band=band, n_boot=0)

    monkeypatch.setattr(html, "build_report", spy)

    def run(*args: str) -> None:
        try:
            main(["report", *args])
        except SystemExit as e:
            assert e.code in (0, None), e.code

    run(str(tmp_path / "a"))
    run(str(tmp_path / "b"))
    run(str(tmp_path / "a"), "-R", "32", "--band", "100,200")
    assert asked == [("a", 64, (500, 900)), ("a", 128, (500, 900)), ("b", 200, (10_000, 40_000)), ("a", 32, (100, 200))]


def test_lengths_a_max_ttft_skipped_reach_the_crossover_inputs_until_they_are_measured(tmp_path):
    from xover.results.read_model import crossover_inputs

    scfg = LlamaConfig("slow", settings=(("n-cpu-moe", "24"),))

    def skipped(length: int, estimate: float) -> dict[str, object]:
        return {"config": "slow", "config_key": scfg.key, "length": length, "rep": 0, "estimate_s": estimate,
                "from_length": 1024, "max_ttft_s": 60.0}  # fmt: skip

    with Store(tmp_path) as st:
        run = st.begin_run("ttft", ["xover"], provenance())
        st.put_config(scfg)
        st.add_ttft_sample(run, "mk", _sample(scfg.key, 1024, 0))
        st.add_artifact(run, "ttft-skipped", skipped(4096, 230.0))
        st.add_artifact(run, "ttft-skipped", skipped(16384, 460.0))
        st.add_artifact(run, "ttft-skipped", skipped(16384, 470.0))  # a later estimate of the same length
        st.end_run(run, "done")
    (c,) = crossover_inputs(load(tmp_path))
    assert c.too_slow == ((4096, 230.0), (16384, 470.0))
    with Store(tmp_path) as st:  # measured after all (a larger max-ttft): no longer too slow
        st.add_ttft_sample(st.begin_run("ttft", ["xover"], provenance()), "mk", _sample(scfg.key, 4096, 0))
    (c,) = crossover_inputs(load(tmp_path))
    assert c.too_slow == ((16384, 470.0),)


def _store_v2_server(study: Path, label: str, args: list[str], key: str) -> None:
    """A store of schema 2 holding one cold sample of a llama-server configuration stored as it was then: keyed by
    its whole argument list, xover's own flags (the model's path, -c, -ngl 99...) in it."""
    with Store(study) as st:
        run = st.begin_run("ttft", ["xover"], provenance())
        spec = {"label": label, "args": args, "env": []}
        st.db.execute(
            "INSERT INTO configs(key, kind, label, spec) VALUES(?,?,?,?)", (key, "server", label, json.dumps(spec))
        )
        st.add_ttft_sample(run, "mk", _sample(key, 1024, 0))
        st.end_run(run, "done")
        st.db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")


def test_the_same_server_stored_from_another_directory_counts_on_resume(tmp_path):
    from xover.llamacpp.server import ServerLaunch

    config = LlamaConfig("a", settings=(("n-cpu-moe", "24"),))
    other = LlamaConfig("a", settings=(("n-cpu-moe", "25"),))
    # the key is what the configuration asks of llama.cpp: not the model's path, -c or any flag xover adds
    old = ServerLaunch(config, Path("/tmp/g24/models/m.gguf"), 4096)
    moved = ServerLaunch(config, Path("/home/me/g24/models/m.gguf"), 4096, cold_cache=False, fit_off=False)
    assert old.args() != moved.args() and old.config.key == moved.config.key == config.key != other.key
    # a store of schema 2 keyed the server by its whole argument list; xover's own -ngl 99 once came before a
    # configuration's -ngl: read back, both are the same configuration, and the one passed once
    twice = ["-m", "/x/m.gguf", "-c", "4096", "-ngl", "99", "-ncmoe", "24", "-ngl", "99"]
    once = ["-m", "/y/m.gguf", "-c", "4096", "-ncmoe", "24", "-ngl", "99"]
    thirty = ["-m", "/y/m.gguf", "-c", "4096", "-ncmoe", "24", "-ngl", "30"]
    assert (
        from_server_record("a", twice, []).key
        == from_server_record("a", once, []).key
        != from_server_record("a", thirty, []).key
    )
    # a study moved from /tmp/g24: its stored samples count for the same configuration run from anywhere
    _store_v2_server(tmp_path, "a", ["-m", "/tmp/g24/models/m.gguf", "-c", "4096", *old.args()[4:]], "old-key")
    data = load(tmp_path)
    assert [c.key for c in data.configs] == [config.key]
    spec = StudySpec(configs=(config,), model_preset="tiny-moe", lengths=(1024,), repetitions=1)
    assert missing_ttft(data.ttft_rows, spec, "mk", moved.config.key, fresh=False) == {}
    assert missing_ttft(data.ttft_rows, spec, "mk", other.key, fresh=False) == {1024: 1}


def test_runs_that_found_part_of_the_vram_budget_taken_are_counted_and_reported(tmp_path):
    """A run's provenance carries ``vram_shortfall`` when xover.hardware.vram.settle found part of the budget taken
    for good before its llama process started (the H200 study of 2026-12-03: 524 MiB, xover's own CUDA context):
    the budget's read model counts such runs and their largest shortfall, and the report's budget line says so."""
    from xover.report.html import budget_lines
    from xover.results.read_model import vram_budgets

    mib = 1 << 20
    hold = (("vram_budget", str(16 << 30)), ("vram_device", "0"), ("vram_held", str(120 << 30)),
            ("vram_free_after", str(16 << 30)), ("vram_total", str(140 << 30)))  # fmt: skip
    with Store(tmp_path) as st:
        for short in (None, 524 * mib, 300 * mib):
            extra = hold + ((("vram_shortfall", str(short)),) if short else ())
            st.end_run(st.begin_run("bench", ["xover", "study"], provenance(extra=extra)), "done")
    (budget,) = vram_budgets(load(tmp_path))
    assert (budget.budget, budget.short_runs, budget.most_short) == (16 << 30, 2, 524 * mib)
    (line,) = budget_lines(load(tmp_path))
    assert line.endswith(
        "2 runs found up to 524 MiB of the budget taken by another process (vram_shortfall in their provenance): "
        "they measured a smaller card than the budget."
    )


def _round_data(runs: list[tuple[int, str | None, int]], rows: list[tuple[int, str, int, int]]) -> StudyData:
    """A study measured in rounds: ``runs`` as (run id, boot id or None, start in s), ``rows`` as (run id, config,
    length, round); every sample cold, counted, sent a second after its run's start."""
    base = 1_796_000_000  # 2026-12 in unix s
    start = {i: base + s for i, _, s in runs}
    stored_runs = tuple(
        StoredRun(i, "study", ("xover",), "2026-12-06T00:00:00+0000", start[i] * 10**9, None, "done",
                  provenance(extra=(("boot_id", boot),) if boot else ()))
        for i, boot, s in runs
    )  # fmt: skip
    samples = tuple(
        StoredSample(
            n,
            run,
            label,
            dataclasses.replace(_sample(label, length, 0), round=r, sent_at_unix_ns=(start[run] + 1) * 10**9),
            "mk",
        )
        for n, (run, label, length, r) in enumerate(rows, 1)
    )
    return StudyData("x", stored_runs, {}, (), tuple((s.label, s.sample) for s in samples), (), (), ttft_rows=samples)


def test_a_round_pairs_the_servers_of_one_session_of_the_machine() -> None:
    """A lease that ended mid-round and a later one that completed it (issue 45's leases 4 and 5): the samples of
    another session than the one that began the round are left out of it, and the report names them."""
    data = _round_data(
        [(1, "boot-a", 0), (2, "boot-a", 60), (3, "boot-b", 7 * 3600), (4, "boot-b", 7 * 3600 + 60)],
        [(1, "a", 1024, 1), (2, "b", 1024, 1), (1, "a", 4096, 1), (3, "b", 4096, 1), (3, "b", 1024, 2),
         (4, "a", 1024, 2), (4, "a", 4096, 2), (3, "b", 4096, 2)],
    )  # fmt: skip
    assert data.off_session == {4}  # b at 4K in round 1, measured in the second boot
    assert [(lb, s.length, s.round) for lb, s in data.cold_samples()] == [
        ("a", 1024, 1), ("b", 1024, 1), ("a", 4096, 1), ("b", 1024, 2), ("a", 1024, 2), ("a", 4096, 2), ("b", 4096, 2)
    ]  # fmt: skip
    b = {c.label: c for c in crossover_inputs(data)}["b"]
    assert sorted(b.rounds[1024]) == [1, 2] and sorted(b.rounds[4096]) == [2]  # the pair of round 1 at 4K is gone
    line = left_out_line(data)
    assert line is not None and line.startswith("Left out of the rounds: round 1: b (cold 4K).")


def test_runs_stored_without_a_boot_id_are_one_session_until_a_gap() -> None:
    gap = SESSION_GAP_S
    data = _round_data(
        [(1, None, 0), (2, None, gap - 60), (3, None, 2 * gap + 60), (4, "boot-a", 2 * gap + 120)],
        [(1, "a", 1024, 1), (2, "b", 1024, 1), (3, "b", 4096, 1), (4, "a", 4096, 1)],
    )
    sessions = data.run_sessions()
    # run 2 starts gap - 61 s after run 1's last request ended (1 s in): the same session; run 3 more than the gap
    # after run 2's: another; a run with a boot id is its boot's
    assert sessions[1] == sessions[2] != sessions[3] and sessions[4] == "boot-a"
    assert data.off_session == {3, 4}
    # a request that ran long (a CPU-only 32K prefill): its end, not its start, is when the run was last seen
    slow = _round_data([(1, None, 0), (2, None, 3 * gap)], [(1, "a", 1024, 1), (2, "b", 1024, 1)])
    (first, second) = slow.ttft_rows
    long_one = dataclasses.replace(first, sample=dataclasses.replace(first.sample, end_ns=int(2.5 * gap * 10**9)))
    assert dataclasses.replace(slow, ttft_rows=(long_one, second)).off_session == frozenset()
    assert slow.off_session == {2}
    # so is its stored finish
    run1 = dataclasses.replace(
        slow.runs[0],
        finished_at=datetime.datetime.fromtimestamp(1_796_000_000 + 2.5 * gap, datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%S%z"
        ),
    )
    assert dataclasses.replace(slow, runs=(run1, slow.runs[1])).off_session == frozenset()
    single = _round_data([(1, "boot-a", 0), (2, "boot-a", 9 * gap)], [(1, "a", 1024, 1), (2, "b", 1024, 1)])
    assert single.off_session == frozenset() and left_out_line(single) is None  # one boot, however long


def test_a_point_left_out_of_its_round_neither_falls_back_nor_counts_as_a_cached_turn() -> None:
    """b's 4K sample of round 1 is another boot's: its samples from before rounds stay superseded (the point was
    measured in rounds), a cached turn of that session is left out too, and a row whose run is not stored leaves its
    round as it is."""
    data = _round_data(
        [(1, "boot-a", 0), (2, "boot-b", 3 * 3600)],
        [(1, "a", 4096, 1), (2, "b", 4096, 1), (1, "b", 4096, 0), (2, "b", 512, 1), (1, "a", 512, 1)],
    )
    before, cached_b, cached_a = data.ttft_rows[2], data.ttft_rows[3], data.ttft_rows[4]
    rows = (
        *data.ttft_rows[:2],
        dataclasses.replace(before, sample=dataclasses.replace(before.sample, round=None)),
        dataclasses.replace(cached_b, sample=dataclasses.replace(cached_b.sample, mode="cached:16384")),
        dataclasses.replace(cached_a, sample=dataclasses.replace(cached_a.sample, mode="cached:16384")),
    )
    data = dataclasses.replace(data, ttft_rows=rows)
    assert data.off_session == {2, 4}
    assert [(lb, s.round) for lb, s in data.cold_samples()] == [("a", 1)]  # b's sample before rounds stays out
    assert [lb for lb, _ in data.cached_samples()[16384]] == ["a"]
    assert left_out_line(data) == (
        "Left out of the rounds: round 1: b (cold 4K, cached turns on 16K, new tokens 512). They were measured in "
        "another session of the machine than the one that began their round (its boot id; runs stored without one "
        "are a session of their own, which ends where more than 10 minutes pass between runs), and a round pairs "
        "servers measured together on one machine."
    )
    orphan = dataclasses.replace(rows[0], row_id=9, run_id=99)  # its run is not stored (a store cut mid-write)
    assert dataclasses.replace(data, ttft_rows=(orphan, *rows)).off_session == {2, 4}
