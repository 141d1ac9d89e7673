"""`xover bench` against the real CPU llama-bench on the tiny synthetic MoE.

Sizes are small (-p 64 -n 16, depths up to 4096, -r 2): each configuration takes well under a few
seconds on two shared cores. On CPU --ncmoe moves nothing, so ncmoe 0 and 2 are distinct
configurations with the same speed, which is all these tests need.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xover.domain import llama_options as opts
from xover.domain.config import matrix
from xover.llamacpp.binaries import Binaries
from xover.measure import bench as benchrun
from xover.measure.provenance import model_id
from xover.report import export
from xover.results.read_model import bench_data, load
from xover.results.store import Store

pytestmark = pytest.mark.real


def _llama_bench_md_cells(markdown: str) -> dict[str, str]:
    """test -> t/s cell, read from llama-bench's own `-o md` table."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines() if line.startswith("|")]
    header = rows[0]
    return {row[header.index("test")]: row[header.index("t/s")] for row in rows[2:]}


def _xover(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "xover", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_sweep_stores_raw_samples_with_provenance_and_renders_like_llama_bench(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xover.llamacpp import process

    # the machine's load is sampled before llama-bench starts, never while it computes (the run's provenance is
    # begun at its first record: sampled there, a bench run read 100% busy from its own work)
    sampled: list[int] = []

    def sample() -> tuple[tuple[str, str], ...]:
        sampled.append(len(process._live))
        return (("cpu_busy", "0.42"),)

    monkeypatch.setattr(benchrun, "machine_load", sample)
    tests = benchrun.BenchTests(model=tiny_model, depths=(0, 256), n_prompt=64, n_gen=16, repetitions=2)
    configs = matrix([(opts.THREADS, ("1", "2"))])
    events: list[object] = []
    outcome = benchrun.run_sweep(tests, configs, llama_bins, tmp_path, command=["test"], on_event=events.append)
    assert sampled == [0]  # once, with no llama process alive

    assert outcome.failures == () and outcome.stored == 8
    assert [c.label for c in outcome.configs] == ["t=1", "t=2"]
    stored_events = [e for e in events if isinstance(e, benchrun.ResultStored)]
    assert [e.result.test_name for e in stored_events] == ["pp64", "tg16", "pp64 @ d256", "tg16 @ d256"] * 2

    with Store(tmp_path) as store:
        (run,) = store.runs()
        assert run["status"] == "done" and run["kind"] == "bench"
        prov = run["provenance"]
        assert prov.llama_build_commit == "0c1e570" and prov.llama_backend == "CPU"
        assert prov.model is not None and prov.model.key == model_id(tiny_model).key
        assert dict(prov.extra)["cpu_busy"] == "0.42"  # the sample taken before, not one taken at the first record
        rows = store.bench_results()
        assert len(rows) == 8
        by_config = {c.key: c for c in outcome.configs}
        for _, _, model_key, r in rows:
            assert model_key == prov.model.key
            assert len(r.samples_ns) == 2 and all(ns > 0 for ns in r.samples_ns)
            assert r.record["n_threads"] == by_config[r.config_key].int_value("threads")
            assert r.record["build_commit"] == "0c1e570"
        md_artifacts = {body["config_key"]: body["markdown"] for _, _, body in store.artifacts(benchrun.MD_ARTIFACT)}
        # -fa auto reports -1 in every record; the CPU backend runs flash attention, and the log says auto chose it
        assert {r.record["flash_attn"] for _, _, _, r in rows} == {-1}
        ran_as = benchrun.resolved_by_config(store, model_id(tiny_model).key)
        assert ran_as == {c.key: {"flash_attn": "1"} for c in outcome.configs}

    # xover's table, rendered from the store, against llama-bench's own -oe md of the same process
    table = export.render_markdown(bench_data(load(tmp_path)))
    lines = table.splitlines()
    header = next(ln for ln in lines if ln.startswith("| test"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    xover_cells = {
        ln.strip("|").split("|")[0].strip(): [c.strip() for c in ln.strip("|").split("|")]
        for ln in lines
        if ln.startswith("| ") and not ln.startswith(("| test", "| ---"))
    }
    assert set(md_artifacts) == set(by_config)
    for key, config in by_config.items():
        theirs = _llama_bench_md_cells(md_artifacts[key])
        assert list(theirs) == ["pp64", "tg16", "pp64 @ d256", "tg16 @ d256"]
        column = columns.index(config.label)
        for test, their_cell in theirs.items():
            assert xover_cells[test][column] == their_cell, (config.label, test)


def test_a_failing_configuration_is_stored_as_failed_and_the_sweep_goes_on(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    # A petabyte of thread stack per OpenMP worker cannot be mapped: that configuration cannot run.
    study = tmp_path / "study"
    proc = _xover(
        "bench",
        "-m",
        str(tiny_model),
        "--threads",
        "2",
        "--env",
        "OMP_STACKSIZE=1000000G,4M",
        "--depth",
        "0,256",
        "--pp",
        "64",
        "--tg",
        "16",
        "-r",
        "2",
        "-o",
        str(study),
        "--llama-bin-dir",
        str(llama_bins.bin_dir),
        cwd=tmp_path,
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    assert "1 of 2 configurations failed" in stderr and "Traceback" not in stderr
    with Store(study) as store:
        ((_, failure),) = store.failures()
        bad, good = store.configs()
        assert failure.config_key == bad.key
        assert "Thread creation failed" in failure.reason and "Thread creation failed" in failure.stderr_tail
        results = store.bench_results()
        assert {r.config_key for _, _, _, r in results} == {good.key}
        assert sorted(r.test_name for _, _, _, r in results) == ["pp64", "pp64 @ d256", "tg16", "tg16 @ d256"]
    assert "| pp64 @ d256 |" in stdout and "failed" in stdout
    assert (
        "OMP_STACKSIZE=1000000G failed: llama-bench exited with code 1 after 0 of 4 tests: libgomp: Thread creation failed"
        in stdout
    )

    # a bad argument for llama-bench fails every configuration, each stored, in one line each
    proc = _xover(
        "bench",
        "-m",
        str(tiny_model),
        "--ncmoe",
        "0,2",
        "--depth",
        "0",
        "--pp",
        "64",
        "--tg",
        "16",
        "-r",
        "1",
        "-o",
        str(study),
        "--llama-bin-dir",
        str(llama_bins.bin_dir),
        "--",
        "--bogus",
        cwd=tmp_path,
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "2 of 2 configurations failed" in stderr
    with Store(study) as store:
        reasons = [f.reason for _, f in store.failures()][1:]
    assert (
        reasons
        == ["llama-bench exited with code 1 after 0 of 2 tests: error: invalid parameter for argument: --bogus"] * 2
    )


def _children(pid: int, name: str) -> list[int]:
    """Live processes called ``name`` whose parent is ``pid`` (a /proc scan; no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if comm == name and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _is_llama_bench(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return "(llama-bench)" in stat and stat[stat.rindex(")") + 2] != "Z"


def _count_results(study: Path) -> int:
    if not (study / "results.sqlite").exists():
        return 0
    try:
        with sqlite3.connect(f"file:{study / 'results.sqlite'}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT count(*) FROM bench_results").fetchone()[0])
    except sqlite3.OperationalError:  # the schema is being created
        return 0


def test_ctrl_c_keeps_completed_records_leaves_no_child_and_resume_skips_measured(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    study = tmp_path / "study"
    args = [
        "bench",
        "-m",
        str(tiny_model),
        "--ncmoe",
        "0,2",
        "--threads",
        "1",
        "--depth",
        "0,4096",
        "--pp",
        "64",
        "--tg",
        "16",
        "-r",
        "2",
        "-o",
        str(study),
        "--llama-bin-dir",
        str(llama_bins.bin_dir),
    ]
    proc = _xover(*args, cwd=tmp_path)
    # Interrupt during the second configuration: the first is complete, the second has its depth-0
    # tests stored and is computing the 4096-token depth.
    deadline = time.monotonic() + 90
    children: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        if _count_results(study) >= 5:
            children = _children(proc.pid, "llama-bench")
            if children:
                break
        time.sleep(0.02)
    assert children, "the sweep ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)

    assert proc.returncode == 130
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert not any(_is_llama_bench(pid) for pid in children)
    with Store(study) as store:
        (run,) = store.runs()
        assert run["status"] == "interrupted"
        kept = store.bench_results()
        c0, c2 = store.configs()
    assert 5 <= len(kept) < 8
    assert sorted(r.test_name for _, _, _, r in kept if r.config_key == c0.key) == [
        "pp64",
        "pp64 @ d4096",
        "tg16",
        "tg16 @ d4096",
    ]

    # the same command again: ncmoe=0 is skipped, ncmoe=2 measures only what it lacks
    proc = _xover(*args, cwd=tmp_path)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "skip ncmoe=0" in stderr
    with Store(study) as store:
        results = store.bench_results()
        runs = store.runs()
    new = [r for _, run_id, _, r in results if run_id == runs[1]["id"]]
    assert {r.config_key for r in new} == {c2.key}
    assert len(results) == 8 and len({(r.config_key, r.test_name) for _, _, _, r in results}) == 8
    assert runs[1]["status"] == "done"

    # --fresh measures everything again
    proc = _xover(*args, "--fresh", cwd=tmp_path)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "skip" not in stderr
    with Store(study) as store:
        assert len(store.bench_results()) == 16
