"""The VRAM budget's holder (xover.hardware.vram) on a fake CUDA runtime with known answers: what it holds,
its refusals, and its life cycle (it ends with xover on normal exit, SIGTERM, SIGINT and SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from procs import gone_within, running
from xover.errors import XoverError
from xover.hardware import vram
from xover.hardware.vram import GIB, VramHolder, parse_budget
from xover.llamacpp import process

MIB = 1 << 20


def card(
    lib: Path,
    free: int,
    total: int = 141 * GIB,
    context: int = 512 * MIB,
    devices: int = 1,
    max_alloc: int | None = None,
) -> dict[str, str]:
    env = {
        "XOVER_CUDART": str(lib),
        "FAKE_CUDA_FREE": str(free),
        "FAKE_CUDA_TOTAL": str(total),
        "FAKE_CUDA_CONTEXT": str(context),
        "FAKE_CUDA_DEVICES": str(devices),
    }
    if max_alloc is not None:
        env["FAKE_CUDA_MAX_ALLOC"] = str(max_alloc)
    return env


def test_it_holds_every_free_byte_beyond_the_budget(fake_cudart: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in card(fake_cudart, free=100 * GIB).items():
        monkeypatch.setenv(k, v)
    with VramHolder(16 * GIB) as hold:
        assert hold.free_before == 100 * GIB - 512 * MIB  # measured after the holder's own context
        assert hold.held == 100 * GIB - 512 * MIB - 16 * GIB
        assert hold.free_after == 16 * GIB  # what llama.cpp will find
        assert hold.total == 141 * GIB and hold.budget == 16 * GIB and hold.device == 0
        assert "16.0 GiB VRAM budget on GPU 0 (141.0 GiB)" in hold.describe()
        assert running(hold.pid)
        assert process._before_start is vram.settle  # each llama process waits for the last one's memory
        vram._shortfall = 524 << 20  # as settle leaves it after memory taken for good
    assert gone_within(hold.pid)
    assert vram.shortfall() == 0 and vram.active_hold() is None  # the next hold starts whole
    assert process._before_start is None


def test_when_large_allocations_fail_it_holds_in_smaller_pieces(
    fake_cudart: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in card(fake_cudart, free=40 * GIB, context=0, max_alloc=300 * MIB).items():
        monkeypatch.setenv(k, v)
    with VramHolder(24 * GIB) as hold:
        assert hold.held == 16 * GIB and hold.free_after == 24 * GIB


@pytest.mark.parametrize(
    ("env", "budget", "message"),
    [
        (
            {"free": 8 * GIB},
            16 * GIB,
            "GPU 0 has 7.5 GiB free (141.0 GiB in all), less than the 16.0 GiB budget: "
            "lower --vram-budget or free the GPU",
        ),
        ({"free": 80 * GIB, "devices": 0}, 16 * GIB, "--vram-budget needs a CUDA GPU: the CUDA runtime sees none"),
    ],
)
def test_refusals_are_one_line(
    fake_cudart: Path, monkeypatch: pytest.MonkeyPatch, env: dict, budget: int, message: str
) -> None:
    for k, v in card(fake_cudart, **env).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(XoverError) as e:
        with VramHolder(budget):
            pass
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_without_a_cuda_runtime_it_refuses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XOVER_CUDART", str(tmp_path / "no-such-libcudart.so"))
    with pytest.raises(XoverError, match=r"^--vram-budget needs a CUDA GPU: no CUDA runtime \(libcudart\) found"):
        with VramHolder(16 * GIB):
            pass


def test_budget_values() -> None:
    assert (
        parse_budget("16GiB") == 16 * GIB
        and parse_budget("24G") == 24 * GIB
        and parse_budget("15000MiB") == 15000 * MIB
    )
    with pytest.raises(XoverError, match="below 256 MiB"):
        parse_budget("100MiB")
    with pytest.raises(XoverError, match="is not an amount of memory"):
        parse_budget("lots")


HOLD_AND_WAIT = textwrap.dedent("""
    import sys, time
    from xover.llamacpp import process
    from xover.hardware.vram import VramHolder
    process.install_signal_handlers()
    try:
        with VramHolder(16 << 30) as hold:
            print(hold.pid, flush=True)
            time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_holder_dies_with_xover(fake_cudart: Path, sig: signal.Signals) -> None:
    env = {**os.environ, **card(fake_cudart, free=100 * GIB)}
    parent = subprocess.Popen([sys.executable, "-c", HOLD_AND_WAIT], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        holder = int(parent.stdout.readline())
        assert running(holder)
        parent.send_signal(sig)
        parent.wait(timeout=20)
        assert gone_within(holder), f"the VRAM holder {holder} outlived xover ({sig.name})"
        if sig != signal.SIGKILL:
            assert parent.returncode == 130 and parent.stdout.read().strip() == "interrupted"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_xover_ttft_refuses_a_budget_in_one_line(fake_cudart: Path, tmp_path: Path) -> None:
    from procs import one_line_error
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    model = str(write_model(PRESETS["tiny-moe"], tmp_path / "tiny.gguf").path)

    def ttft(budget: str, **env: str) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "xover",
            "ttft",
            "-m",
            model,
            "--lengths",
            "512",
            "-o",
            str(tmp_path / "st"),
            "--vram-budget",
            budget,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env})

    one_line_error(ttft("16GiB", XOVER_CUDART=str(tmp_path / "none.so")), "--vram-budget needs a CUDA GPU")
    one_line_error(ttft("16GiB", **card(fake_cudart, free=8 * GIB)), "less than the 16.0 GiB budget")
    one_line_error(ttft("lots"), "is not an amount of memory")


def test_settle_waits_for_the_freed_memory_only_under_a_hold(monkeypatch) -> None:
    """Known answers with a constructed clock and free-memory readings: no hold, no wait; under a hold, wait
    until the free memory is back within 256 MiB of what it was when the hold began, at most the timeout."""
    from xover.hardware import vram

    MIB = 1 << 20
    assert vram.settle(free_now=lambda: 0) is None  # no hold active
    monkeypatch.setattr(vram, "_active", object())
    monkeypatch.setattr(vram, "_baseline_free", 16_000 * MIB)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    readings = iter([10_000 * MIB, 14_000 * MIB, 15_800 * MIB])
    assert vram.settle(free_now=lambda: next(readings), sleep=sleep, clock=lambda: now[0]) == 0.5
    assert vram.settle(free_now=lambda: None, sleep=sleep, clock=lambda: now[0]) == 0.0  # no reading: no wait
    assert vram.shortfall() == 0
    monkeypatch.setattr(vram, "_baseline_free", None)
    assert vram.settle(free_now=lambda: 0) is None  # a hold without nvidia-smi: nothing to wait on


def test_settle_waits_once_for_memory_taken_for_good_and_says_so(monkeypatch) -> None:
    """Memory that does not come back (the H200 study of 2026-12-03: xover's own CUDA context, 524 MiB of a 16 GiB
    budget) costs one wait, one warning naming the amount and who holds GPU memory, and a shortfall that every later
    run's provenance records; later starts wait only for what is free now, and what comes back later counts too."""
    from xover.hardware import detect, vram
    from xover.measure.provenance import _vram_budget

    MIB = 1 << 20
    monkeypatch.setattr(vram, "_active", vram.VramHold(16 << 30, 0, 120 << 30, 136 << 30, 16 << 30, 140 << 30, 1))
    monkeypatch.setattr(vram, "_baseline_free", 15_859 * MIB)
    monkeypatch.setattr(vram, "_shortfall", 0)
    monkeypatch.setattr(detect, "gpu_processes", lambda: [(905, 126_764 * MIB), (884, 518 * MIB)])
    now, warned = [0.0], []

    def sleep(s: float) -> None:
        now[0] += s

    def settle(free: int) -> float | None:
        return vram.settle(
            free_now=lambda: free * MIB, timeout_s=20, sleep=sleep, clock=lambda: now[0], warn=warned.append
        )

    assert settle(15_335) == 20  # the first start waits the whole timeout
    assert warned == [
        "VRAM budget: 524 MiB of the 16.0 GiB budget is still taken after waiting 20 s before starting a llama "
        "process (GPU memory by process, every GPU: pid 905 126,764 MiB, pid 884 518 MiB); llama processes from now "
        "on find that much less free, and their runs record it (vram_shortfall)"
    ]
    assert vram.shortfall() == 524 * MIB and ("vram_shortfall", str(524 * MIB)) in _vram_budget()
    assert settle(15_335) == 0 and settle(15_200) == 0  # later starts: no wait, within the slack of the new level
    assert settle(15_635) == 0 and vram.shortfall() == 224 * MIB  # 300 MiB came back: the shortfall shrinks
    assert settle(16_000) == 0 and vram.shortfall() == 0 and vram._baseline_free == 15_859 * MIB  # all of it, no more
    assert settle(15_400) == 20 and len(warned) == 2  # below the first level again: wait, and say so again
