"""Which engine? (issue 33) A study with two builds on the CPU: mainline llama.cpp and ik_llama.cpp, both built by
xover from their registry sdists, on tiny-moe. Each configuration runs its own engine's llama-bench and
llama-server with that engine's flags; every cold sample of either engine is proven cold (ik_llama.cpp's server
reports no cache_n: the proof is that it processed every prompt token); the tuning stage searches each engine's
own knobs; the verdicts compare the two like any configurations."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xover.analysis import advise
from xover.domain.codec import decode
from xover.measure import tune
from xover.results.store import Store

pytestmark = pytest.mark.real
IK, MAIN = "ik_llama.cpp", "llama.cpp"  # the example's configuration names

EXAMPLE = Path(__file__).parents[2] / "examples" / "engines.toml"  # run as the README shows it


def test_the_example_study_compares_mainline_and_ik_llama_cpp_each_on_its_own_build(
    llama_bins, ik_bins, tmp_path: Path
) -> None:
    spec = EXAMPLE
    out = tmp_path / "out"
    started = time.time()
    env = dict(os.environ, XOVER_LLAMA_BIN_DIR=str(llama_bins.bin_dir), XOVER_IK_LLAMA_BIN_DIR=str(ik_bins.bin_dir))
    # ik_llama.cpp's folder from the command line (--llama-bin-dir ENGINE=DIR), not from its variable
    study_env = {k: v for k, v in env.items() if k != "XOVER_IK_LLAMA_BIN_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "xover", "study", str(spec), "-o", str(out), "-q",
         "--llama-bin-dir", f"ik_llama.cpp={ik_bins.bin_dir}"],
        env=study_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(out / "results.sqlite")
    label_of = dict(db.execute("SELECT key, label FROM configs"))
    # each engine's llama-bench: ik_llama.cpp's records carry its build and its own fields; its prefill is measured
    # from an empty context (it has no -d), its decode at each depth with -gp
    tests: dict[str, set[tuple[int, int, int]]] = {}
    for key, np_, ng, nd, rec in db.execute("SELECT config_key, n_prompt, n_gen, n_depth, record FROM bench_results"):
        tests.setdefault(label_of[key], set()).add((np_, ng, nd))
        record = __import__("json").loads(rec)
        if label_of[key] == IK:
            assert record["build_commit"] == "ik0.1.5" and "fused_moe" in record and record["backends"] == "CPU"
        else:
            assert record["build_commit"] == "0c1e570" and "n_depth" in record and "fused_moe" not in record
    depths = (256, 1024, 2048)
    assert tests[IK] == {(256, 0, 0), *((0, 16, d) for d in depths)}
    assert tests[MAIN] == {*((256, 0, d) for d in depths), *((0, 16, d) for d in depths)}
    # every cold sample of both engines, in 2 rounds of fresh servers: proven cold, none refused
    cold = db.execute(
        "SELECT config_key, length, cache_n, prompt_n, round, cache_ok FROM ttft_samples WHERE mode = 'cold'"
    ).fetchall()
    by_label: dict[str, list[int]] = {}
    for key, length, cache_n, prompt_n, rnd, ok in cold:
        assert (cache_n, prompt_n, ok) == (0, length, 1), (label_of[key], length, cache_n, prompt_n)
        by_label.setdefault(label_of[key], []).append(rnd)
    for label in (IK, MAIN):  # 3 lengths x 2 repetitions in each of rounds 1 and 2 (a drift check: < 0)
        assert sorted(x for x in by_label[label] if x > 0) == [1] * 6 + [2] * 6, label
    # each engine's llama-server got its own flags: no -fit for ik_llama.cpp, -fit off for mainline
    args = {b["label"]: b["args"] for b in map(__import__("json").loads, (x for (x,) in db.execute(
        "SELECT body FROM artifacts WHERE name = 'server-props'")))}  # fmt: skip
    assert "-fit" not in args[IK] and "-fit" in args[MAIN]
    # and ik_llama.cpp's wrote no trace log into the working directory (--log-disable)
    assert not (Path.cwd() / "llama.log").exists() or (Path.cwd() / "llama.log").stat().st_mtime < started
    # the tuning stage searched each engine's own knobs: -fmoe on ik_llama.cpp only
    with Store(out) as store:
        searched = {
            b["config"]: [v.knob for v in decode(advise.Search, b["search"]).verdicts]
            for _, _, b in store.artifacts(tune.ARTIFACT)
        }
    assert searched[IK] == ["ubatch-size", "fused-moe"] and searched[MAIN] == ["ubatch-size"]
    # the verdicts compare them like any configurations
    assert f"{MAIN} vs {IK}" in r.stdout
    assert f"Engines: llama.cpp: {MAIN}; ik_llama.cpp: {IK}." in r.stdout and "At each engine's defaults" in r.stdout
    md = (out / "report.md").read_text()
    assert f"| {IK} |" in md and f"| {MAIN} |" in md
    # each engine's build is in the study's provenance
    with Store(out) as store:
        (builds,) = [b for _, _, b in store.artifacts("engines")][-1:]
    by_engine = {b["engine"]: b for b in builds}
    assert by_engine[IK]["bin_dir"] == str(ik_bins.bin_dir) and by_engine[MAIN]["bin_dir"] == str(llama_bins.bin_dir)
    # and each run's: one run per engine in every stage, its provenance naming the build whose numbers it holds
    engine_of = {key: json.loads(spec)["engine"] for key, spec in db.execute("SELECT key, spec FROM configs")}
    bin_dir = {IK: str(ik_bins.bin_dir), MAIN: str(llama_bins.bin_dir)}
    prov = {run_id: json.loads(p) for run_id, p in db.execute("SELECT id, provenance FROM runs")}
    measured = set(
        db.execute("SELECT run_id, config_key FROM ttft_samples UNION SELECT run_id, config_key FROM bench_results")
    )
    assert {engine_of[key] for _, key in measured} == {IK, MAIN}
    for run_id, key in measured:
        p = prov[run_id]
        assert (p["llama_bin_dir"], p.get("llama_engine")) == (bin_dir[engine_of[key]], engine_of[key]), (run_id, key)
    # and `xover llama which` shows each engine's binaries
    which = subprocess.run(
        [sys.executable, "-m", "xover", "llama", "which"], env=env, capture_output=True, text=True, timeout=60
    )
    assert which.returncode == 0 and "[ik_llama.cpp]" in which.stdout and str(ik_bins.server) in which.stdout


def test_an_engine_without_a_build_is_a_one_line_error_before_anything_runs(llama_bins, tmp_path: Path) -> None:
    from procs import one_line_error

    empty = tmp_path / "no-build"
    empty.mkdir()
    env = dict(os.environ, XOVER_LLAMA_BIN_DIR=str(llama_bins.bin_dir), XOVER_IK_LLAMA_BIN_DIR=str(empty))
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "xover", "study", str(EXAMPLE), "-o", str(out), "-q"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "has no executable llama-bench or llama-server" in one_line_error(r, "XOVER_IK_LLAMA_BIN_DIR")
    assert (
        not (out / "results.sqlite").exists()
        or not sqlite3.connect(out / "results.sqlite").execute("SELECT count(*) FROM bench_results").fetchone()[0]
    )
