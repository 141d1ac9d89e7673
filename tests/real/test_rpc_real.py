"""RPC workers against the real ggml-rpc-server: a study with an ``rpc-local = 1`` configuration is measured by
the real llama-bench and llama-server with layers on the worker, the worker's provenance is stored, and no worker
survives the study, a SIGINT of xover, nor a SIGKILL of xover."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import children_named, gone_within, running

pytestmark = pytest.mark.real

WORKER = "ggml-rpc-server"
STUDY = (
    "lengths = [256]\nresponse-tokens = [8]\nrepetitions = 1\nrounds = 1\nmax-rounds = 1\nbench-repetitions = 1\n"
    "bench-depths = [0]\n"
    'pp = 64\ntg = 8\ntune = false\nskip = ["cache", "session", "report"]'
)
RPC_CONFIG = (
    '\n[[config]]\nname = "rpc"\nrpc-local = 1\nrpc-threads = 1\nn-gpu-layers = 2\n'  # 2 of tiny-moe's 4 layers
)
CONFIGS = '\n[[config]]\nname = "local"\n' + RPC_CONFIG


def _spec(path: Path, model: Path, study: str = STUDY, configs: str = CONFIGS) -> Path:
    path.write_text(f'[model]\npath = "{model}"\n\n[study]\n{study}\n{configs}')
    return path


def _xover(*args: str) -> list[str]:
    return [sys.executable, "-m", "xover", *args]


def _study_ok(spec: Path, out: Path, llama_bins, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``xover study`` of ``spec`` into ``out`` on xover's build: it succeeds and stores no failure."""
    r = subprocess.run(
        _xover("study", str(spec), "-o", str(out), "--llama-bin-dir", str(llama_bins.bin_dir), *args),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    db = out / "results.sqlite"
    assert _query(db, "SELECT COUNT(*) FROM failures") == [(0,)]
    return r, db


def _query(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_rpc_local_configuration_is_measured_on_a_real_worker(tmp_path: Path, tiny_model: Path, llama_bins) -> None:
    assert llama_bins.rpc_server is not None, "xover's build has no ggml-rpc-server"
    out = tmp_path / "out"
    r, db = _study_ok(_spec(tmp_path / "spec.toml", tiny_model), out, llama_bins, "--progress-jsonl", "-")
    # llama-bench: both configurations, and the rpc one ran with the RPC backend (llama-bench's own record says so)
    rows = _query(db, "SELECT c.label, c.spec, r.record FROM bench_results r JOIN configs c ON c.key = r.config_key")
    by_label: dict[str, list[dict]] = {}
    for label, spec_json, record in rows:
        by_label.setdefault(label, []).append({"spec": json.loads(spec_json), "record": json.loads(record)})
    assert set(by_label) == {"local", "rpc"}
    assert all("RPC" in x["record"]["backends"] for x in by_label["rpc"])
    assert not any("RPC" in x["record"]["backends"] for x in by_label["local"])
    (endpoint,) = {dict(map(tuple, x["spec"]["settings"]))["rpc"] for x in by_label["rpc"]}
    assert endpoint.startswith("127.0.0.1:")
    # llama-server: cold TTFT for both; the rpc one's server put its layers on the worker
    assert sorted(
        _query(
            db,
            "SELECT c.label, COUNT(*) FROM ttft_samples s JOIN configs c ON c.key = s.config_key "
            "WHERE s.mode = 'cold' AND s.cache_ok = 1 AND s.error IS NULL AND s.round > 0 GROUP BY c.label",
        )
    ) == [("local", 1), ("rpc", 1)]
    server_logs = [p.read_text(errors="replace") for p in (out / "logs").glob("server-rpc-*.log")]
    assert server_logs and all(f"--rpc {endpoint}" in t.splitlines()[0] for t in server_logs)
    # the worker: its log, its startup lines, the connections of llama-bench and llama-server; stopped at the end
    (worker_log,) = (out / "logs").glob(f"rpc-worker-{endpoint.rsplit(':', 1)[1]}-*.log")
    text = worker_log.read_text()
    assert "Starting RPC server" in text and "CPU:" in text
    # the readiness probe, the link probe, then llama-bench's and llama-server's
    assert text.count("Accepted client connection") >= 4
    # provenance of every run of the study names the worker, its build and its device
    provs = [json.loads(p) for (p,) in _query(db, "SELECT provenance FROM runs WHERE kind IN ('bench', 'ttft')")]
    assert provs
    for prov in provs:
        extra = dict(map(tuple, prov["extra"]))
        desc = extra[f"rpc_worker {endpoint}"]
        assert "xover's ggml-rpc-server" in desc and "cpu" in desc and "CPU:" in desc and "-t 1" in desc
    assert f"RPC worker {endpoint}" in r.stdout  # the info event
    # the link to the worker, probed once through the RPC protocol before the configurations ran
    ((body,),) = _query(db, "SELECT body FROM artifacts WHERE name = 'rpc-link'")
    (link,) = json.loads(body)
    assert link["endpoint"] == endpoint and link["protocol"].startswith("7.") and "error" not in link
    assert len(link["rtt_ms"]) == 20 and all(0 < x < 1000 for x in link["rtt_ms"])
    assert link["block_bytes"] == 8 << 20 and len(link["up_mib_s"]) == len(link["down_mib_s"]) == 3
    assert all(x > 0 for x in link["up_mib_s"] + link["down_mib_s"])
    assert f"RPC link {endpoint}: RTT " in r.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_no_worker_survives_xover(sig: signal.Signals, tmp_path: Path, tiny_model: Path, llama_bins) -> None:
    """xover gets SIGINT (Ctrl-C: it unwinds and stops the worker) or SIGKILL (no handler runs: the kernel kills
    the worker, started with PR_SET_PDEATHSIG) while the rpc configuration is being measured."""
    study = STUDY.replace("bench-repetitions = 1", "bench-repetitions = 200").replace("pp = 64", "pp = 2048")
    spec = _spec(tmp_path / "spec.toml", tiny_model, study, RPC_CONFIG)
    xover = subprocess.Popen(
        _xover("study", str(spec), "-o", str(tmp_path / "out"), "-q", "--llama-bin-dir", str(llama_bins.bin_dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not found and xover.poll() is None:
            found = children_named(xover.pid, WORKER)
            time.sleep(0.05)
        assert found, "xover never started its RPC worker"
        # wait until llama-bench is connected to the worker (it logs the connection, the third after the readiness
        # probe's and the link probe's), then signal xover
        (log,) = (tmp_path / "out" / "logs").glob("rpc-worker-*.log")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and log.read_text().count("Accepted client connection") < 3:
            time.sleep(0.05)
        assert log.read_text().count("Accepted client connection") >= 3, "llama-bench never reached the worker"
        os.kill(xover.pid, sig)
        _, stderr = xover.communicate(timeout=30)
        if sig == signal.SIGINT:
            assert xover.returncode == 130, stderr
            assert "Traceback" not in stderr
        assert all(gone_within(p) for p in found), f"RPC worker {found} outlived xover ({sig.name})"
    finally:
        if xover.poll() is None:
            xover.kill()
            xover.wait()
        for pid in found:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


def test_user_run_worker_is_used_and_an_unreachable_one_is_one_line(
    tmp_path: Path, tiny_model: Path, llama_bins
) -> None:
    """``rpc = ["host:port"]``: a worker the user runs (here a real ggml-rpc-server this test starts) is passed to
    llama-bench as --rpc and named in the provenance; before it runs, the study stops at once with one line."""
    from xover.llamacpp import rpc

    assert llama_bins.rpc_server is not None
    (port,) = rpc.free_ports(1, first=51500)
    configs = f'\n[[config]]\nname = "theirs"\nrpc = ["127.0.0.1:{port}"]\n'
    study = STUDY.replace('skip = ["cache", "session", "report"]', 'skip = ["ttft", "cache", "session", "report"]')
    spec = _spec(tmp_path / "spec.toml", tiny_model, study, configs)
    args = _xover("study", str(spec), "-o", str(tmp_path / "out"), "-q", "--llama-bin-dir", str(llama_bins.bin_dir))
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [
        f"xover: error: RPC worker 127.0.0.1:{port} does not accept connections: start `ggml-rpc-server -H HOST -p "
        f"{port}` there (a llama.cpp build with -DGGML_RPC=ON), or use rpc-local = N for workers xover starts"
    ]
    worker = subprocess.Popen(
        [str(llama_bins.rpc_server), "-p", str(port), "-t", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while not rpc.accepts("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        worker.kill()
        worker.wait()
    db = tmp_path / "out" / "results.sqlite"
    records = [json.loads(x) for (x,) in _query(db, "SELECT record FROM bench_results")]
    assert records and all(x["backends"] == "RPC" for x in records)
    (prov,) = [json.loads(p) for (p,) in _query(db, "SELECT provenance FROM runs WHERE kind = 'bench'")]
    assert dict(map(tuple, prov["extra"]))[f"rpc_worker 127.0.0.1:{port}"].endswith(
        "run by the user (its build and devices are not known to xover)"
    )


def test_experts_on_a_real_worker_through_override_tensor(tmp_path: Path, tiny_model: Path, llama_bins) -> None:
    """``override-tensor`` with ``{rpc0}``: the experts of layers 2 and 3 live on xover's worker while every other
    tensor stays here (``n-gpu-layers = 0``); llama-bench and llama-server both get --rpc before -ot, as both resolve
    the buffer type while parsing their arguments, and llama-bench's own log puts the experts' bytes on the worker."""
    configs = (
        '\n[[config]]\nname = "experts over RPC"\nrpc-local = 1\nrpc-threads = 1\nn-gpu-layers = 0\n'
        "override-tensor = ['blk\\.[23]\\.ffn_.*_exps=RPC0[{rpc0}]']\n"
    )
    out = tmp_path / "out"
    _, db = _study_ok(_spec(tmp_path / "spec.toml", tiny_model, STUDY, configs), out, llama_bins, "-q")
    records = [json.loads(x) for (x,) in _query(db, "SELECT record FROM bench_results")]
    (endpoint,) = {x["tensor_buft_overrides"].rsplit("[", 1)[1].rstrip("]") for x in records}
    assert endpoint.startswith("127.0.0.1:")
    assert len(records) == 2 and all(
        x["tensor_buft_overrides"] == f"blk\\.[23]\\.ffn_.*_exps=RPC0[{endpoint}]"
        and x["backends"] == "RPC"
        and x["n_gpu_layers"] == 0
        for x in records
    )
    (memory,) = [
        json.loads(b) for (b,) in _query(db, "SELECT body FROM artifacts WHERE name = 'memory'") if "llama-bench" in b
    ]
    on_worker = [n for buft, kind, n in memory["buffers"] if buft == f"RPC0[{endpoint}]" and kind == "model"]
    here = [n for buft, kind, n in memory["buffers"] if buft.startswith("CPU") and kind == "model"]
    assert on_worker and on_worker[0] > 0 and sum(here) > 0, memory["buffers"]
    assert _query(
        db, "SELECT COUNT(*) FROM ttft_samples WHERE mode = 'cold' AND cache_ok = 1 AND error IS NULL AND round > 0"
    ) == [(1,)]
    server_logs = sorted((out / "logs").glob("server-experts*.log"))
    assert len(server_logs) == 2  # round 1 and the drift check
    for server_log in server_logs:
        command = server_log.read_text(errors="replace").splitlines()[0]
        assert f"--rpc {endpoint}" in command and f"-ot blk\\.[23]\\.ffn_.*_exps=RPC0[{endpoint}]" in command
        assert command.index("--rpc") < command.index("-ot")
