"""The tests of tests/unit/test_client_faults.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakes.llama_server import pid_from_log
from procs import pid_gone
from xover.domain.config import LlamaConfig
from xover.errors import XoverError
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, context_size, has_flag, log_path_for, parse_build_info
from xover.measure.ttft import TtftPlan, TtftRun, summarize_points
from xover.results.store import Store

# ---- pure: plan, checks, metrics, summaries -----------------------------------------------------


def test_server_spec_args_and_helpers(tmp_path: Path, fake_bins: Binaries) -> None:
    config = LlamaConfig(
        "ncmoe=12", settings=(("n-cpu-moe", "12"), ("threads", "8"), ("flash-attn", "on"), ("ubatch-size", "1024"))
    )
    spec = ServerLaunch(config, Path("/m.gguf"), context_size(32768, 200))
    assert spec.args() == (
        "-m",
        "/m.gguf",
        "-c",
        "33280",
        "-ngl",
        "99",
        "-np",
        "1",
        "--cache-ram",
        "0",
        "-fit",
        "off",
        "-ncmoe",
        "12",
        "-ub",
        "1024",
        "-t",
        "8",
        "-fa",
        "on",
    )
    assert spec.name == "ncmoe=12"
    assert spec.to_argv(Path("/bin/llama-server"), 5000)[-4:] == ["--host", "127.0.0.1", "--port", "5000"]
    # the port changes per start; the configuration does not (nor do xover's own flags belong to it)
    assert "--port" not in spec.config.server_argv() and "-m" not in spec.config.server_argv()
    assert dataclasses.replace(spec, model=Path("/elsewhere/m.gguf"), ctx_size=1024).config.key == config.key
    # a configuration's own -ngl (any spelling) is passed once: llama-server warns about a repeated one
    for own in ("-ngl", "--gpu-layers", "--n-gpu-layers"):
        passed = LlamaConfig("x", settings=(("n-cpu-moe", "24"),), server_args=(own, "30"))
        args = ServerLaunch(passed, Path("/m.gguf"), 33280).args()
        assert args[:4] == ("-m", "/m.gguf", "-c", "33280") and "-ngl" not in args[:-2]
        assert args[-2:] == (own, "30")
    set_ngl = LlamaConfig("x", settings=(("n-cpu-moe", "24"), ("n-gpu-layers", "30")))
    args = ServerLaunch(set_ngl, Path("/m.gguf"), 33280).args()
    assert args.count("-ngl") == 1 and args[args.index("-ngl") + 1] == "30"
    assert context_size(1024, 16) == 1536
    assert parse_build_info("b7123-0c1e570") == {"build_number": 7123, "build_commit": "0c1e570"}
    assert parse_build_info(None) == {}
    assert has_flag(fake_bins.server, "-fit") and not has_flag(fake_bins.server, "--no-such-flag")
    (tmp_path / "server-ncmoe=12-1.log").touch()
    assert log_path_for(tmp_path, "ncmoe=12").name == "server-ncmoe=12-2.log"
    assert log_path_for(tmp_path, "a b/c").name == "server-a_b_c-1.log"
    (tmp_path / "lease4").mkdir()  # a lent machine's logs kept per lease: their names are not given again
    (tmp_path / "lease4" / "server-ncmoe=12-2.log").touch()
    assert log_path_for(tmp_path, "ncmoe=12") == tmp_path / "server-ncmoe=12-3.log"
    assert log_path_for(tmp_path / "absent", "x").name == "server-x-1.log"


# ---- client on an injected transport --------------------------------------------------------------


# ---- faults: each one line, nothing measured before it lost -----------------------------------------


# ---- lifecycle with the fake binary -----------------------------------------------------------------


def _spec(model: Path, *fake_args: str) -> ServerLaunch:
    return ServerLaunch(LlamaConfig("fake", server_args=fake_args), model, ctx_size=1024)


# Long enough for the fake (a Python program) to start and listen on 2 busy cores, where it takes 10x its usual
# tenth of a second: the last /health answer and the log's "listening" line are then the fake's own.
NEVER_HEALTHY_S = 5.0


def test_server_never_healthy_stops_it_and_quotes_the_log(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    async def go() -> None:
        async with LlamaServer(
            fake_bins.server,
            _spec(tiny_model, "--fake-fault", "never-healthy"),
            tmp_path,
            startup_timeout_s=NEVER_HEALTHY_S,
        ):
            pass

    with pytest.raises(XoverError) as e:
        asyncio.run(go())
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("llama-server (fake) http://127.0.0.1:")
    assert f"did not become healthy within {NEVER_HEALTHY_S:g} s (last /health: HTTP 503 Loading model)" in msg
    assert "log tail: " in msg and "server is listening" in msg
    assert pid_gone(pid_from_log(tmp_path / "server-fake-1.log"))


STARTUP_S = 60.0


def test_server_dying_early_is_reported_at_once(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    async def go() -> None:
        async with LlamaServer(
            fake_bins.server, _spec(tiny_model, "--fake-exit", "3"), tmp_path, startup_timeout_s=STARTUP_S
        ):
            pass

    t = time.monotonic()
    with pytest.raises(
        XoverError,
        match=r"^llama-server \(fake\) exited with code 3 while starting; log tail: .*"
        r"error loading model: fake failure \(.*server-fake-1.log\)$",
    ):
        asyncio.run(go())
    assert time.monotonic() - t < STARTUP_S / 2  # at once: it did not wait out the start-up timeout


def test_no_server_outlives_its_context(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    pids: list[int] = []

    async def go(fail: bool) -> None:
        async with LlamaServer(fake_bins.server, _spec(tiny_model), tmp_path) as srv:
            assert srv.pid is not None and srv.props["build_info"] == "b0-fake"
            assert srv.model_meta["n_vocab"] == 512
            pids.append(srv.pid)
            if fail:
                raise RuntimeError("boom")

    asyncio.run(go(False))
    with pytest.raises(RuntimeError):
        asyncio.run(go(True))
    assert len(pids) == 2 and all(pid_gone(p) for p in pids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server-fake-1.log", "server-fake-2.log"]


def test_managed_run_known_answers(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    """Fake rates: 20,000 tok/s prefill, 50 tok/s decode -> TTFT of 2,000 tokens is 100 ms and more, the 10 tokens
    after the first take 200 ms and more.

    A wait of the fake is never shorter than asked, so the bounds on that side are exact; on the other side a busy
    2-core machine stretches the waits and stalls either process (100 ms and more), so those bounds only catch an
    answer an order of magnitude off."""
    plan = TtftPlan(lengths=(500, 2000), reps=3, response_tokens=11, seed=5)
    specs = [
        ServerLaunch(
            LlamaConfig(f"ncmoe={n}", (("n-cpu-moe", str(n)),), server_args=("--fake-decode-tps", "50")),
            tiny_model,
            context_size(2000, 11),
        )
        for n in (0, 2)
    ]
    with Store(tmp_path) as store:
        run = TtftRun(store, plan, ["test"], binaries=fake_bins, model=tiny_model)
        out = asyncio.run(run.run_managed(specs, tmp_path / "logs"))
        assert store.runs()[-1]["status"] == "done"
        prov = store.runs()[-1]["provenance"]
        assert (prov.llama_build_commit, prov.llama_build_number) == ("fake", 0)
        props = store.artifacts("server-props")
        assert [p[2]["label"] for p in props] == ["ncmoe=0", "ncmoe=2"]
        assert props[0][2]["props"]["build_info"] == "b0-fake"
        assert props[0][2]["model_meta"]["n_vocab"] == 512
    assert out.failures == ()
    assert len(out.samples) == 12 and all(s.cache_ok for s in out.samples)
    assert all(s.timings is not None and (s.timings.cache_n, s.timings.prompt_n) == (0, s.length) for s in out.samples)
    by_len = {(out.labels[p.config_key], p.length): p for p in summarize_points(out.samples)}
    p = by_len[("ncmoe=2", 2000)]
    assert p.ttft_ns is not None and 100e6 <= p.ttft_ns.median < 1e9
    assert p.prefill_tps_server is not None and 2_000 < p.prefill_tps_server.median <= 20_000
    assert p.decode_tps_server is not None and 5 < p.decode_tps_server.median <= 11 / 0.2  # 11 tokens, 10 waits
    # the client's decode is timed from the first token's arrival: a first token read late on a busy machine shortens
    # the 10 gaps of 20 ms it divides by (at 2 ms gaps, one read 5 ms late broke a bound of 650 t/s); read 100 ms late
    # it still leaves 100 ms. The formula itself has its known answer in test_sample_metrics_known_answers.
    assert p.decode_tps_client is not None and 5 < p.decode_tps_client.median <= 100
    assert p.gap_ns is not None and 0 < p.gap_ns.median < 500e6  # the client's TTFT holds the server's prompt_ms
    assert (tmp_path / "logs" / "server-ncmoe=0-1.log").exists() and (
        tmp_path / "logs" / "server-ncmoe=2-1.log"
    ).exists()


def test_managed_warm_mode(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    plan = TtftPlan(lengths=(64, 256), reps=2, response_tokens=4, mode="warm", seed=5)
    spec = ServerLaunch(LlamaConfig("fake"), tiny_model, ctx_size=1024)
    with Store(tmp_path) as store:
        out = asyncio.run(
            TtftRun(store, plan, ["test"], binaries=fake_bins, model=tiny_model).run_managed([spec], tmp_path)
        )
    assert len(out.samples) == 4 and all(s.cache_ok and s.mode == "warm" for s in out.samples)
    assert all(s.timings and (s.timings.cache_n, s.timings.prompt_n) == (s.length - 1, 1) for s in out.samples)


def test_a_server_that_cannot_start_is_a_failure_and_the_next_config_runs(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    plan = TtftPlan(lengths=(64,), reps=1, response_tokens=4, seed=5)
    specs = [
        ServerLaunch(LlamaConfig("broken", server_args=("--fake-exit", "1")), tiny_model, ctx_size=1024),
        ServerLaunch(LlamaConfig("fine"), tiny_model, ctx_size=1024),
    ]
    with Store(tmp_path) as store:
        out = asyncio.run(
            TtftRun(store, plan, ["test"], binaries=fake_bins, model=tiny_model).run_managed(specs, tmp_path)
        )
    assert [f.stage for f in out.failures] == ["server-start"]
    assert [out.labels[s.config_key] for s in out.samples] == ["fine"]


def test_ctrl_c_stops_the_server_keeps_samples_and_exits_130(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    study = tmp_path / "study"
    xover = Path(sys.executable).parent / "xover"
    cmd = [
        str(xover),
        "ttft",
        "-m",
        str(tiny_model),
        "--llama-bin-dir",
        str(fake_bins.bin_dir),
        "--lengths",
        "64",
        "-r",
        "100",
        "--response-tokens",
        "10",
        "-o",
        str(study),
        "--",
        "--fake-decode-tps",
        "40",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # the samples come within seconds; this only bounds a hang
        n = 0
        while time.monotonic() < deadline and n < 2:
            time.sleep(0.2)
            if (study / "results.sqlite").exists():
                try:
                    with sqlite3.connect(study / "results.sqlite") as db:
                        n = db.execute("SELECT count(*) FROM ttft_samples").fetchone()[0]
                except sqlite3.OperationalError:
                    pass
        assert n >= 2, "no samples were stored in time"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted; completed results are kept" in err
    (log,) = (study / "logs").glob("server-*-1.log")  # one configuration, one server
    assert pid_gone(pid_from_log(log))
    with Store(study) as store:
        assert len(store.ttft_samples()) >= 2
        assert store.runs()[-1]["status"] == "interrupted"


def test_extra_args_that_add_slots_are_noticed(tmp_path: Path, fake_bins: Binaries, tiny_model: Path) -> None:
    """`-- -np 4` overrides xover's -np 1: the gap warning must then name slot saving, not rule it out."""
    plan = TtftPlan(lengths=(64,), reps=1, response_tokens=4, seed=5)
    specs = [
        ServerLaunch(LlamaConfig("np4", server_args=("-np", "4")), tiny_model, ctx_size=1024),
        ServerLaunch(LlamaConfig("np1"), tiny_model, ctx_size=1024),
    ]
    with Store(tmp_path) as store:
        out = asyncio.run(
            TtftRun(store, plan, ["test"], binaries=fake_bins, model=tiny_model).run_managed(specs, tmp_path)
        )
    assert {out.labels[k]: v for k, v in out.cold_cache.items()} == {"np4": False, "np1": True}


def test_cache_lab_servers_start_within_its_startup_timeout(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    """run_cache_lab's startup_timeout_s reaches every scenario's server: a server that never becomes healthy
    is given up after 1 s, recorded as a server-start failure, and the next scenario runs."""
    from xover.analysis.cachelab import lab_plan
    from xover.measure.cachelab import run_cache_lab

    plan = lab_plan(1024)
    start = time.monotonic()
    config = LlamaConfig("fake", server_args=("--fake-fault", "never-healthy"))
    outcome = run_cache_lab(tmp_path, fake_bins, tiny_model, 1024, config, startup_timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert outcome.samples == ()
    assert [f.stage for f in outcome.failures] == ["server-start"] * len(plan)
    assert all("did not become healthy within 1 s" in f.reason for f in outcome.failures)
    assert elapsed < 10 * len(plan)  # LlamaServer's own default is 600 s a server
