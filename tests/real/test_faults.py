"""Fault injection on real studies (CPU build, tiny-moe), each followed by a resume.

Faults: llama-server killed with SIGKILL mid-request; configurations whose server cannot load
(a context far beyond memory, an unknown flag); the chosen port already taken (by a silent
listener, by another HTTP server, on every attempt); a server that never becomes healthy (the fake,
the only fault the real binary cannot produce on demand); llama-bench crashing with SIGSEGV
mid-sweep; SIGINT and SIGTERM to ``xover study`` at seeded random moments.

After each: every completed point is in the store, the failure is recorded with its reason,
``PRAGMA integrity_check`` is ok, no run is left marked ``running``, the resumed study completes
with every point measured exactly as often as asked, and no llama process the run started is
alive (every pid comes from the pid-recording shims of :mod:`fakes.bins`, which ``exec`` the real
binaries). ``XOVER_FAULT_SEEDS`` (default 3) sets how many random interruption moments are tried
per signal.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from fakes.bins import FAKE_SERVER, recorded_pids, running, shim_bin_dir
from xover.results.read_model import load

pytestmark = pytest.mark.real

SEEDS = int(os.environ.get("XOVER_FAULT_SEEDS", "3"))
# Safety nets against a hang, never expected to be reached: on 2 busy cores llama.cpp runs 10x slower, and a whole
# study of these tiny ones then takes minutes. A wait for an observable event polls until it happens, up to this.
STUDY_TIMEOUT_S = 900.0


# ---- helpers ------------------------------------------------------------------------------------


def _spec(path: Path, model: Path, study: str, configs: str) -> Path:
    path.write_text(f'[model]\npath = "{model}"\n\n[study]\n{study}\n{configs}')
    return path


def _configs(*names_and_args: tuple[str, str]) -> str:
    return "".join(f'\n[[config]]\nname = "{name}"\n{extra}\n' for name, extra in names_and_args)


def _xover(*args: str) -> list[str]:
    return [sys.executable, "-m", "xover", *args]


def _query(db: Path, sql: str, *params: object) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _good_cold(db: Path) -> Counter:
    """(label, length) -> cold samples that passed their check (a drift check's samples, round < 0, apart)."""
    return Counter(
        _query(
            db,
            "SELECT c.label, s.length FROM ttft_samples s JOIN configs c ON c.key = s.config_key "
            "WHERE s.mode = 'cold' AND s.cache_ok = 1 AND s.error IS NULL AND (s.round IS NULL OR s.round > 0)",
        )
    )


def _failures(db: Path) -> list[tuple[str, str, str, str]]:
    """(label or config key, stage, point, reason) of every stored failure."""
    return _query(
        db,
        "SELECT COALESCE(c.label, f.config_key), f.stage, f.point, f.reason FROM failures f "
        "LEFT JOIN configs c ON c.key = f.config_key ORDER BY f.id",
    )


def _check_store(db: Path) -> None:
    assert _query(db, "PRAGMA integrity_check") == [("ok",)]
    assert _query(db, "SELECT id, kind FROM runs WHERE status = 'running'") == []  # every run says how it ended


def _none_running(pid_file: Path) -> set[int]:
    pids = recorded_pids(pid_file)
    assert pids, "the shims recorded no llama process"
    alive = {p for p in pids if running(p)}
    assert not alive, f"llama processes started by the run are still alive: {sorted(alive)}"
    return pids


def _server_pids(pid_file: Path) -> list[int]:
    """Live llama-server processes (not `--help` probes) among the recorded pids."""
    out = []
    for pid in sorted(recorded_pids(pid_file)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if running(pid) and argv and argv[0].endswith(b"llama-server") and b"--port" in argv:
            out.append(pid)
    return out


@pytest.fixture
def shims(tmp_path: Path, llama_bins) -> tuple[Path, Path]:
    """(bin dir of pid-recording shims around the real binaries, the pid file)."""
    pid_file = tmp_path / "llama-pids"
    return shim_bin_dir(tmp_path / "bin", llama_bins.bin_dir, pid_file), pid_file


def _study(
    spec: Path, out: Path, bin_dir: Path, *extra: str, timeout: float = STUDY_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _xover("study", str(spec), "-o", str(out), "-q", "--llama-bin-dir", str(bin_dir), *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---- the port xover chose is already taken --------------------------------------------------------


class _Silent:
    """Something listening on a port that never answers (connections wait in its backlog)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def close(self) -> None:
        self.sock.close()


class _OtherServer:
    """Another HTTP server on the port, in its own process (it answers /health 200 within a
    millisecond, long before the real llama-server fails to bind and exits)."""

    def __init__(self, log: Path) -> None:
        self.port = _free_port()
        with log.open("w") as f:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(FAKE_SERVER),
                    "--port",
                    str(self.port),
                    "--fake-load-s",
                    "0",
                    "--fake-max-life-s",
                    "120",
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("intruder, taken_calls", [("silent", 1), ("http", 1), ("silent", 3)])
def test_port_already_taken(
    intruder: str, taken_calls: int, tmp_path: Path, tiny_model: Path, llama_bins, monkeypatch
) -> None:
    """The first ``taken_calls`` ports xover picks are held by another program: a silent listener, or
    an HTTP server that answers /health 200 (whose numbers must never be stored as the configuration's).
    With one taken port, xover retries on another; with every attempt taken, the configuration's failure
    is recorded and the next configuration is measured; the resume fills the gap."""
    from xover.domain.study_spec import load_spec
    from xover.llamacpp import server
    from xover.llamacpp.binaries import resolve
    from xover.measure.study import run_study

    pid_file = tmp_path / "llama-pids"
    # a slow start, as on a GPU: the other server's answer comes long before this one fails to bind
    bin_dir = shim_bin_dir(tmp_path / "bin", llama_bins.bin_dir, pid_file, server_start_delay_s=0.3)
    spec = load_spec(
        _spec(
            tmp_path / "spec.toml",
            tiny_model,
            "lengths = [256]\nresponse-tokens = [8]\nrepetitions = 2\nrounds = 1\nmax-rounds = 1\n"
            'skip = ["tune", "bench", "cache", "session", "report"]',
            _configs(("first", "threads = 2"), ("second", "threads = 1")),
        )
    )
    out = tmp_path / "out"
    holder = _Silent() if intruder == "silent" else _OtherServer(tmp_path / "other-server.log")
    taken = holder.port
    real_free_port = server.free_port
    calls = []

    def free_port() -> int:
        calls.append(1)
        return taken if len(calls) <= taken_calls else real_free_port()

    monkeypatch.setattr(server, "free_port", free_port)
    try:
        outcome = run_study(spec, out, resolve(bin_dir))
    finally:
        holder.close()
    db = out / "results.sqlite"
    _check_store(db)
    _none_running(pid_file)
    logs = sorted((out / "logs").glob("server-first-*.log"))
    assert "couldn't bind" in logs[0].read_text()  # the real llama-server met the taken port
    props = [body for _, _, body in _store_artifacts(db, "server-props")]
    assert props and all(p["props"].get("build_info") != "b0-fake" for p in props)  # only real servers measured
    assert all(p["pid"] in recorded_pids(pid_file) for p in props)
    good = _good_cold(db)
    if taken_calls < 3:
        # the attempt on the taken port, round 1 on another, and the drift check's fresh server
        assert outcome.failures == 0 and len(logs) == 3
        assert good == {("first", 256): 2, ("second", 256): 2}
        return
    assert outcome.failures == 1 and len(logs) == 3
    [(label, stage, _, reason)] = _failures(db)
    assert (label, stage) == ("first", "server-start") and "could not bind a free port" in reason
    assert good == {("second", 256): 2}
    again = run_study(spec, out, resolve(bin_dir))  # the resume, with free ports
    assert again.failures == 0
    assert _good_cold(db) == {("first", 256): 2, ("second", 256): 2}
    _check_store(db)
    _none_running(pid_file)


def _store_artifacts(db: Path, name: str) -> list[tuple[int | None, str, dict]]:
    return [
        (r, n, json.loads(b)) for r, n, b in _query(db, "SELECT run_id, name, body FROM artifacts WHERE name = ?", name)
    ]


# ---- configurations that cannot load, a server that never becomes healthy --------------------------


def _beyond_memory_context() -> int:
    """A -c whose KV cache (2 KiB per token on tiny-moe) is twice this machine's memory and swap."""
    kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(("MemTotal:", "SwapTotal:")):
            kib += int(line.split()[1])
    return 2 * kib // 2


@pytest.mark.parametrize("fault", ["context-beyond-memory", "unknown-flag"])
def test_configuration_that_cannot_load(fault: str, tmp_path: Path, tiny_model: Path, shims) -> None:
    """One configuration's server (and, for the unknown flag, its llama-bench) cannot start: its failure
    is stored with llama.cpp's own reason once (it is not tried again in the stage's later rounds), the other
    configuration is measured in the same run, in all 3 rounds, and a resume re-measures nothing that succeeded
    and records the failure again."""
    bin_dir, pid_file = shims
    broken = (
        f'server-args = ["-c", "{_beyond_memory_context()}"]'
        if fault == "context-beyond-memory"
        else 'server-args = ["--no-such-flag"]\nbench-args = ["--no-such-flag"]'
    )
    spec = _spec(
        tmp_path / "spec.toml",
        tiny_model,
        "lengths = [256]\nresponse-tokens = [8]\nrepetitions = 2\nbench-repetitions = 1\npp = 32\ntg = 8\n"
        'skip = ["tune", "cache", "session", "report"]',
        _configs(("broken", broken), ("ok", "threads = 2")),
    )
    out = tmp_path / "out"
    db = out / "results.sqlite"
    r = _study(spec, out, bin_dir)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "failed; they are recorded in the store" in r.stdout
    failures = _failures(db)
    server = [f for f in failures if f[1] == "server-start"]
    assert [f[0] for f in server] == ["broken"]
    want = "insufficient memory" if fault == "context-beyond-memory" else "invalid argument"
    assert want in server[0][3] and "exited with code" in server[0][3], server[0][3]
    bench_failed = [f for f in failures if f[1] == "bench"]
    if fault == "unknown-flag":
        assert [f[0] for f in bench_failed] == ["broken"] and "exited with code" in bench_failed[0][3]
    else:
        assert bench_failed == []
    assert _good_cold(db) == {("ok", 256): 2 * 3}  # 2 samples in each of 3 rounds
    ids = set(_query(db, "SELECT id FROM ttft_samples")) | {
        ("b", i) for (i,) in _query(db, "SELECT id FROM bench_results")
    }
    _check_store(db)
    _none_running(pid_file)

    r = _study(spec, out, bin_dir)  # the resume
    assert r.returncode == 0, r.stderr
    assert (
        set(_query(db, "SELECT id FROM ttft_samples"))
        | {("b", i) for (i,) in _query(db, "SELECT id FROM bench_results")}
        == ids
    )
    assert len(_failures(db)) == 2 * len(failures)  # tried again, failed again for the same reason
    again = _failures(db)[len(failures) :]
    assert [f[:2] for f in again] == [f[:2] for f in failures]
    assert want in [f for f in again if f[1] == "server-start"][0][3]
    _check_store(db)
    _none_running(pid_file)


def _server_fault(tmp_path: Path, tiny_model: Path, name: str, fault: str, study: str = "") -> tuple[Path, Path, Path]:
    """(spec, out, its store) for a cold-TTFT study of two configurations: ``name``, whose server is the fake with
    ``--fake-fault fault``, and "ok", a real one; ``study`` adds to the spec's [study]."""
    spec = _spec(
        tmp_path / "spec.toml",
        tiny_model,
        f"lengths = [256]\nresponse-tokens = [8]\nrepetitions = 2\n{study}"
        'skip = ["tune", "bench", "cache", "session", "report"]',
        _configs((name, f'server-args = ["--fake-fault", "{fault}"]'), ("ok", "threads = 2")),
    )
    out = tmp_path / "out"
    return spec, out, out / "results.sqlite"


# The spec's timeout bounds every server's start, the real configuration's too: its tiny model loads in well under a
# second on an idle machine, and 10x slower on 2 busy cores, so the timeout leaves room for that.
START_TIMEOUT_S = 10


def test_server_never_healthy(tmp_path: Path, tiny_model: Path, shims) -> None:
    """A server that listens but answers /health 503 forever (the fake: a real one cannot be made to) is
    given up after the spec's timeout, stopped, and recorded; the real configuration is measured."""
    bin_dir, pid_file = shims
    spec, out, db = _server_fault(tmp_path, tiny_model, "stuck", "never-healthy", f"timeout = {START_TIMEOUT_S}\n")
    for attempt in (1, 2):  # the run, then the resume: the fault persists, the measured point stays
        r = _study(spec, out, bin_dir)
        assert r.returncode == 0, r.stderr
        failures = _failures(db)
        assert [(f[0], f[1]) for f in failures] == [("stuck", "server-start")] * attempt
        assert f"did not become healthy within {START_TIMEOUT_S} s" in failures[-1][3], failures[-1][3]
        assert "503" in failures[-1][3], failures[-1][3]
        assert _good_cold(db) == {("ok", 256): 2 * 3}  # 2 samples in each of 3 rounds, stuck in none
        _check_store(db)
        pids = _none_running(pid_file)
        logs = sorted((out / "logs").glob("server-stuck-*.log"))
        assert len(logs) == attempt and "fake-llama-server pid" in logs[-1].read_text()
        assert int(logs[-1].read_text().split("fake-llama-server pid ")[1].split()[0]) in pids


def test_server_aborts_and_hangs(tmp_path: Path, tiny_model: Path, shims) -> None:
    """A llama-server that prints ggml's abort message mid-request and then hangs, as ik_llama.cpp did at a CUDA
    out of memory on the H200 (its backtrace's forked child never exits: the fake forks one too): it is stopped
    with its whole process group 5 s after the message instead of holding the study for the client's hour, the
    failure names the abort and its cause, and the real configuration is measured in every round."""
    bin_dir, pid_file = shims
    spec, out, db = _server_fault(tmp_path, tiny_model, "aborts", "abort-hang")
    r = _study(spec, out, bin_dir)  # without the watch, the request waits an hour: TimeoutExpired
    assert r.returncode == 0, r.stderr
    failures = _failures(db)
    assert failures and {f[0] for f in failures} == {"aborts"}, failures
    reason = failures[0][3]
    assert "llama-server aborted: /tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:132: CUDA error" in reason, reason
    assert "(CUDA error: out of memory)" in reason and "hung there, stopped after 5 s" in reason, reason
    assert _good_cold(db) == {("ok", 256): 2 * 3}
    _check_store(db)
    _none_running(pid_file)
    children = [
        int(line.split()[-1])
        for log in (out / "logs").glob("server-aborts-*.log")
        for line in log.read_text().splitlines()
        if line.startswith("fake forked child pid ")
    ]
    assert children and not any(running(p) for p in children)  # the hung child went with its group


# ---- llama-server killed mid-request; llama-bench crashing mid-sweep --------------------------------


def _in_request(port: int) -> bool:
    """True while a TCP connection to ``port`` is established (llama-server closes each one after its
    streamed response, so an open one is a request in flight)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _port_of(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return int(argv[argv.index(b"--port") + 1])


def _threads_of(pid: int) -> bytes | None:
    """The ``-t`` a llama-server was started with (None: gone, or none given)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return argv[argv.index(b"-t") + 1] if b"-t" in argv[:-1] else None


def _good_of(db: Path, label: str) -> int:
    """Counted cold samples of ``label`` stored so far (0 while the store is being made)."""
    try:
        return sum(n for (c, _), n in _good_cold(db).items() if c == label) if db.exists() else 0
    except sqlite3.Error:
        return 0


def _stop_mid_request(
    proc: subprocess.Popen[str], pid_file: Path, db: Path, label: str, threads: bytes
) -> tuple[int, int]:
    """SIGKILL the first llama-server of configuration ``label`` (told by its ``-t threads``) while one of its
    measured requests is in flight: (its pid, its samples stored before the kill).

    No fixed sleep decides what is in progress: once a sample of it is stored, the server is frozen (SIGSTOP), so
    nothing it serves completes from then on; then, frozen, it holds a request in flight: the one it was serving, or
    the client's next one, whose connection the kernel completes in the listening socket's backlog (an established
    connection to its port either way). Only then is it killed."""
    deadline = time.monotonic() + STUDY_TIMEOUT_S
    victim = None
    while victim is None and proc.poll() is None and time.monotonic() < deadline:
        victim = next((p for p in _server_pids(pid_file) if _threads_of(p) == threads), None)
        time.sleep(0.005)
    assert victim is not None, f"{label}'s llama-server never started: {proc.poll()}"
    port = _port_of(victim)
    while proc.poll() is None and running(victim) and _good_of(db, label) < 1:
        time.sleep(0.005)
    try:
        os.kill(victim, signal.SIGSTOP)
    except ProcessLookupError:
        pass
    while running(victim) and not _in_request(port):
        time.sleep(0.005)
    # gone: xover had measured all its samples and stopped it (SIGTERM, then SIGKILL) before it was frozen
    assert running(victim), f"{label}'s first server measured all its samples before it could be stopped mid-request"
    seen = _good_of(db, label)
    os.kill(victim, signal.SIGKILL)
    return victim, seen


def test_server_sigkilled_mid_request(tmp_path: Path, tiny_model: Path, shims) -> None:
    """SIGKILL the first configuration's llama-server while a measured request is in flight: the
    samples before it stay, the cut request is stored as an errored sample and a failure with the
    reason, the next configuration is measured (in both rounds; the victim in no later round), and the resume
    completes exactly the missing samples."""
    bin_dir, pid_file = shims
    spec = _spec(
        tmp_path / "spec.toml",
        tiny_model,
        "lengths = [256, 512]\nresponse-tokens = [96]\nrepetitions = 3\nrounds = 2\nmax-rounds = 2\n"
        'skip = ["tune", "bench", "cache", "session", "report"]',
        _configs(("victim", "threads = 2"), ("other", "threads = 1")),
    )
    out = tmp_path / "out"
    db = out / "results.sqlite"
    proc = subprocess.Popen(
        _xover("study", str(spec), "-o", str(out), "-q", "--llama-bin-dir", str(bin_dir)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        killed, seen = _stop_mid_request(proc, pid_file, db, "victim", b"2")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    stdout, stderr = proc.communicate(timeout=STUDY_TIMEOUT_S)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    [(label, stage, point, reason)] = _failures(db)
    assert (label, stage) == ("victim", "ttft") and point.startswith("L="), (point, reason)
    errored = _query(db, "SELECT length, error FROM ttft_samples WHERE error IS NOT NULL")
    assert len(errored) == 1 and errored[0][1] in reason  # the request in flight, stored with what went wrong
    good = _good_cold(db)
    # the samples stored before the kill: those seen then, and at most the one whose last bytes the client had read
    # as the server froze (stored as it closed the connection); never all 6 of the round
    victim = sum(v for (c, _), v in good.items() if c == "victim")
    assert 1 <= seen <= victim <= seen + 1 and victim < 6, (seen, good)
    assert {k: v for k, v in good.items() if k[0] == "other"} == {("other", 256): 6, ("other", 512): 6}
    before = set(_query(db, "SELECT id FROM ttft_samples"))
    _check_store(db)
    pids = _none_running(pid_file)
    assert killed in pids

    r = _study(spec, out, bin_dir)  # the resume
    assert r.returncode == 0, r.stderr
    assert _good_cold(db) == {(c, L): 3 * 2 for c in ("victim", "other") for L in (256, 512)}
    assert before <= set(_query(db, "SELECT id FROM ttft_samples"))
    assert len(_failures(db)) == 1
    _check_store(db)
    _none_running(pid_file)


def _bench_fault(
    tmp_path: Path, tiny_model: Path, llama_bins, first: str, marker_kind: str
) -> tuple[Path, Path, Path, Path]:
    """(pid file, marker, shim folder, spec) for a llama-bench study of two configurations, ``first`` and "other",
    whose first llama-bench meets the fault of :func:`fakes.bins.shim_bin_dir`'s ``marker_kind`` (the marker set)."""
    pid_file, marker = tmp_path / "llama-pids", tmp_path / "fault-once"
    marker.touch()
    bin_dir = shim_bin_dir(tmp_path / "bin", llama_bins.bin_dir, pid_file, **{marker_kind: marker})
    spec = _spec(
        tmp_path / "spec.toml",
        tiny_model,
        'lengths = [256, 512]\nbench-repetitions = 2\npp = 32\ntg = 8\nskip = ["tune", "ttft", "cache", "session", "report"]',
        _configs((first, "threads = 2"), ("other", "threads = 1")),
    )
    return pid_file, marker, bin_dir, spec


def test_llama_bench_crashes_mid_sweep(tmp_path: Path, tiny_model: Path, llama_bins) -> None:
    """The first configuration's llama-bench dies of SIGSEGV right after its first test, a signal xover did not send
    (issue 69): an interrupted measurement, not a result. Its test stays stored as raw data, its job runs again at
    once in a fresh process, every test of it, and nothing is recorded as failed; the second configuration is
    measured; the resume finds nothing to measure, and each test reads as the retry's."""
    pid_file, marker, bin_dir, spec = _bench_fault(tmp_path, tiny_model, llama_bins, "crashed", "bench_crash_marker")
    out = tmp_path / "out"
    db = out / "results.sqlite"
    tests = "SELECT c.label, b.test, b.id FROM bench_results b JOIN configs c ON c.key = b.config_key"
    r = _study(spec, out, bin_dir)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()  # the crash happened
    assert _failures(db) == []
    (retried,) = [body for _, _, body in _store_artifacts(db, "llama-bench-retried")]
    assert retried["reason"].startswith("llama-bench was killed by SIGSEGV after 1 of 4 tests (a signal xover did")
    stored = _query(db, tests)
    assert Counter(c for c, _, _ in stored) == {"crashed": 1 + 4, "other": 4}  # the crashed process's one, kept
    _check_store(db)
    pids = _none_running(pid_file)
    assert len(pids) >= 4  # the wrapper, the real llama-bench it crashed, the retry, the second configuration's

    r = _study(spec, out, bin_dir)  # the resume
    assert r.returncode == 0, r.stderr
    assert _query(db, tests) == stored and _failures(db) == []
    # the read model keeps the latest record of each test: the retry's, one per test
    shown = Counter((label, res.test_name) for label, res in load(out).bench)
    assert shown == {
        (c, t): 1 for c in ("crashed", "other") for t in ("pp32 @ d256", "tg8 @ d256", "pp32 @ d512", "tg8 @ d512")
    }
    _check_store(db)
    _none_running(pid_file)


def test_llama_bench_aborts_and_hangs(tmp_path: Path, tiny_model: Path, llama_bins) -> None:
    """The first configuration's llama-bench prints ggml's abort message after its first test and hangs (a forked
    child holds its pipes, as ik_llama.cpp's backtrace child did): it is stopped 5 s later with its group, the
    failure names the abort and its cause, and the second configuration is measured."""
    pid_file, marker, bin_dir, spec = _bench_fault(tmp_path, tiny_model, llama_bins, "aborts", "bench_abort_marker")
    out = tmp_path / "out"
    db = out / "results.sqlite"
    r = _study(spec, out, bin_dir)  # without the stop, llama-bench's pipes stay open: TimeoutExpired
    assert r.returncode == 0, r.stderr
    assert not marker.exists()  # the abort happened
    [(label, stage, _, reason)] = _failures(db)
    assert (label, stage) == ("aborts", "bench")
    assert reason == (
        "llama-bench aborted after 1 of 4 tests (/src/ggml/src/ggml-cuda.cu:132: CUDA error "
        "(CUDA error: out of memory)) and hung: stopped after 5 s"
    ), reason
    stored = _query(db, "SELECT c.label FROM bench_results b JOIN configs c ON c.key = b.config_key")
    assert Counter(c for (c,) in stored) == {"aborts": 1, "other": 4}
    _check_store(db)
    _none_running(pid_file)  # the hung child included (the wrapper records it)


# ---- SIGINT / SIGTERM to `xover study` at random moments --------------------------------------------

SIGNAL_SPEC = (
    "lengths = [256, 512, 1024]\nresponse-tokens = [16]\nrepetitions = 2\nrounds = 2\nmax-rounds = 2\n"
    "bench-repetitions = 2\n"
    'pp = 64\ntg = 16\nskip = ["tune", "cache", "session", "report"]'
)
EXPECTED_BENCH = 2 * 3 * 2  # configurations x depths x (pp, tg)


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_at_a_random_moment(sig: signal.Signals, seed: int, tmp_path: Path, tiny_model: Path, shims) -> None:
    """``xover study`` gets SIGINT or SIGTERM at a seeded random moment of its measuring stages (odd seeds:
    a second signal shortly after, as an impatient user's second Ctrl-C): it exits 130 with one line,
    every sample it announced is stored, no run stays marked running, no llama process survives, and the
    resume completes every point exactly once without re-measuring what was stored."""
    rng = random.Random(seed)
    bin_dir, pid_file = shims
    spec = _spec(
        tmp_path / "spec.toml", tiny_model, SIGNAL_SPEC, _configs(("t=1", "threads = 1"), ("t=2", "threads = 2"))
    )
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    db = out / "results.sqlite"
    proc = subprocess.Popen(
        _xover(
            "study", str(spec), "-o", str(out), "-q", "--llama-bin-dir", str(bin_dir), "--progress-jsonl", str(events)
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + STUDY_TIMEOUT_S
    while proc.poll() is None and not recorded_pids(pid_file) and time.monotonic() < deadline:
        time.sleep(0.005)  # the measuring stages have begun: the first llama process has started
    assert recorded_pids(pid_file), f"no llama process started: {proc.poll()}"
    time.sleep(rng.uniform(0.0, 3.0))
    proc.send_signal(sig)
    if seed % 2:
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=STUDY_TIMEOUT_S)
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    if proc.returncode != 0:  # 0: the study finished before the signal
        # 130 after the one line; rarely (a few in a hundred, early in the study, as before this test
        # existed) the process is then ended by the signal itself: the line is out, the cleanup done
        assert proc.returncode in (130, -sig), stderr
        assert [ln for ln in stderr.splitlines() if ln.strip()] == ["xover: interrupted; completed results are kept"]
    announced = Counter()
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if (
            ev["stage"] == "ttft"
            and ev["status"] == "progress"
            and " L=" in ev["detail"]
            and "re-run" not in ev["detail"]
        ):
            counted = re.fullmatch(r"round \d+ (.+) L=(\d+)", ev["detail"])  # not the drift check's
            if counted:
                announced[(counted[1], int(counted[2]))] += 1
    if db.exists():
        _check_store(db)
        stored = _good_cold(db)
        assert all(stored[k] >= n for k, n in announced.items()), (announced, stored)  # nothing announced was lost
        before = set(_query(db, "SELECT id FROM ttft_samples")) | {
            ("b", i) for (i,) in _query(db, "SELECT id FROM bench_results")
        }
    else:
        assert not announced
        before = set()
    _none_running(pid_file)

    r = _study(spec, out, bin_dir)  # the resume
    assert r.returncode == 0, r.stderr
    after = set(_query(db, "SELECT id FROM ttft_samples")) | {
        ("b", i) for (i,) in _query(db, "SELECT id FROM bench_results")
    }
    assert before <= after
    assert _good_cold(db) == {(c, L): 2 * 2 for c in ("t=1", "t=2") for L in (256, 512, 1024)}
    bench = Counter(_query(db, "SELECT config_key, test FROM bench_results"))
    assert len(bench) == EXPECTED_BENCH and set(bench.values()) == {1}
    _check_store(db)
    _none_running(pid_file)
