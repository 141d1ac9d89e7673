"""A VRAM budget: hold every byte of GPU memory beyond it, so llama.cpp sees a card of that size.

``--vram-budget 16GiB`` on an H200 answers for a 16 GiB card: before any llama process starts, a
holder process allocates (plain ``cudaMalloc`` through the CUDA runtime, never managed memory) all of
the GPU's free memory except the budget, and keeps it until xover ends. llama.cpp's own fit logic and
its allocations then find ``budget`` bytes free, as on the smaller card.

The holder dies with xover, whatever way xover ends:

- normal exit and Ctrl-C / SIGTERM: :class:`VramHolder` closes the holder's stdin and reaps it (and
  :func:`xover.llamacpp.process.stop_all` reaps it at interpreter exit, as any child);
- SIGKILL of xover: the holder asked the kernel for ``PR_SET_PDEATHSIG = SIGKILL``, and it also ends
  when its stdin (a pipe from xover) reaches end of file; the driver frees a dead process's memory.

Refusals are one line each: no CUDA runtime or no CUDA GPU, a device index out of range, or less free
memory than the budget (someone else uses the card, or the budget exceeds it).

The child side is :func:`_hold_main` (``python -m xover.hardware.vram BUDGET DEVICE PARENT_PID``). The
CUDA runtime comes from :func:`xover.hardware.detect.cudart`; ``XOVER_CUDART`` names another library
(the tests' fake with known answers).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from xover.console import warn as console_warn
from xover.domain.profiles import parse_bytes
from xover.errors import XoverError
from xover.hardware import detect
from xover.llamacpp import process

GIB = 1 << 30
_MIN_CHUNK = 2 << 20  # below this a failed allocation ends the hold: what is left is the driver's slack
_READY_TIMEOUT_S = 120.0  # creating a CUDA context and allocating 100+ GiB takes seconds, not minutes
_active: VramHold | None = None
_baseline_free: int | None = None  # nvidia-smi's free bytes once the hold began, before any llama process
_SETTLE_SLACK = 256 << 20
_SETTLE_TIMEOUT_S = 20.0
_shortfall = 0  # bytes of the budget found taken for good (settle's timeouts), in every later run's provenance


def active_hold() -> VramHold | None:
    """The budget this process holds the GPU to now (for the provenance of every run under it)."""
    return _active


def shortfall() -> int:
    """Bytes of the budget that :func:`settle` found still taken after its wait, and stopped waiting for: every
    llama process since then found that much less free than the budget (0 when none)."""
    return _shortfall


@dataclasses.dataclass(frozen=True)
class VramHold:
    """What the holder measured and holds (bytes): the provenance of a budgeted run."""

    budget: int
    device: int
    held: int
    free_before: int  # free memory the holder saw once its CUDA context existed
    free_after: int  # what llama.cpp will see free: about ``budget``
    total: int
    pid: int

    def describe(self) -> str:
        return (
            f"{self.budget / GIB:.1f} GiB VRAM budget on GPU {self.device} ({self.total / GIB:.1f} GiB): "
            f"xover holds {self.held / GIB:.1f} GiB, {self.free_after / GIB:.2f} GiB left free"
        )

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def parse_budget(text: str) -> int:
    """``--vram-budget``'s value in bytes (``24GiB``, ``16G``, ``15000MiB``); at least 256 MiB."""
    n = parse_bytes(text)
    if n < 256 << 20:
        raise XoverError(f"--vram-budget {text}: a budget below 256 MiB leaves no room for a model: give e.g. 16GiB")
    return n


class VramHolder:
    """Context manager: start the holder, wait until it holds, stop it on the way out (any way out)."""

    def __init__(self, budget: int, device: int = 0) -> None:
        self.budget, self.device = budget, device
        self.proc: subprocess.Popen[str] | None = None
        self.hold: VramHold | None = None

    def __enter__(self) -> VramHold:
        argv = [sys.executable, "-m", "xover.hardware.vram", str(self.budget), str(self.device), str(os.getpid())]
        self.proc = process.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
        try:
            self.hold = self._wait_ready(self.proc)
        except BaseException:
            self.close()
            raise
        global _active, _baseline_free
        _active = self.hold
        _baseline_free = _smi_free()
        process.before_each_start(settle)  # every llama process waits for the last one's memory to come back
        return self.hold

    def _wait_ready(self, proc: subprocess.Popen[str]) -> VramHold:
        assert proc.stdout is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        lines: list[str] = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:  # the holder ended without holding: its last line says why
                proc.wait(timeout=10)
                why = next((x for x in reversed(lines) if x.startswith("ERROR ")), None)
                raise XoverError(
                    why[len("ERROR ") :]
                    if why
                    else f"the VRAM holder ended (exit {proc.returncode}) before holding: {' | '.join(lines)[-300:]}"
                )
            line = line.strip()
            lines.append(line)
            if line.startswith("READY "):
                held, free_before, free_after, total = (int(x) for x in line.split()[1:5])
                return VramHold(self.budget, self.device, held, free_before, free_after, total, proc.pid)
        raise XoverError(f"the VRAM holder did not finish allocating within {_READY_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        global _active, _baseline_free, _shortfall
        if _active is self.hold:
            _active, _baseline_free, _shortfall = None, None, 0
            process.before_each_start(None)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # the holder frees its memory and exits on end of file
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
            process.forget(proc)
        except subprocess.TimeoutExpired:
            process.stop(proc)

    def __exit__(self, *exc: object) -> None:
        self.close()


def _smi_free() -> int | None:

    gpu = detect.detect_gpu()
    return gpu.free_bytes if gpu is not None and gpu.free_bytes else None


def settle(
    free_now: Callable[[], int | None] = _smi_free,
    timeout_s: float = _SETTLE_TIMEOUT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    warn: Callable[[str], None] | None = None,
) -> float | None:
    """Under a budget, before a llama process starts: wait until the card's free memory is back to what it was
    when the hold began. The driver releases an exited process's memory a little after it is reaped, and at the
    budget's edge a server started at once finds less than the budget free (seen on an H200 under 16 GiB: a level
    that had served failed at its warm-up, then served when started again). Returns the seconds waited, or None
    when there is no hold or no free-memory reading (nvidia-smi) to wait on; never raises.

    After ``timeout_s`` the memory is taken for good (another process holds it): the caller starts anyway, one
    warning says how much and who holds GPU memory, the shortfall joins every later run's provenance
    (:func:`shortfall`), and later calls wait only for what is free now, or as much of the shortfall as has come
    back. Waiting the whole timeout before every process cost an H200 study 20 s for each of 38 llama processes,
    about 13 of its 23 minutes, while xover's own CUDA context held 524 MiB (2026-12-03)."""
    global _baseline_free, _shortfall
    if _active is None or _baseline_free is None:
        return None
    start = clock()
    while True:
        free = free_now()
        if free is not None and _shortfall and free > _baseline_free:  # what was taken has come back
            back = min(free - _baseline_free, _shortfall)
            _baseline_free, _shortfall = _baseline_free + back, _shortfall - back
        if free is None or free >= _baseline_free - _SETTLE_SLACK:
            return clock() - start
        if clock() - start >= timeout_s:
            lost = _baseline_free - free
            _baseline_free, _shortfall = free, _shortfall + lost
            (warn or console_warn)(
                f"VRAM budget: {lost / (1 << 20):,.0f} MiB of the {_active.budget / GIB:.1f} GiB budget is still "
                f"taken after waiting {timeout_s:.0f} s before starting a llama process (GPU memory by process, "
                f"every GPU: {_gpu_processes() or 'nvidia-smi does not say'}); llama processes from now on find "
                "that much less free, and their runs record it (vram_shortfall)"
            )
            return clock() - start
        sleep(0.25)


def _gpu_processes() -> str:

    return ", ".join(f"pid {pid} {used / (1 << 20):,.0f} MiB" for pid, used in detect.gpu_processes())


def holding(budget: int | None, device: int = 0) -> Any:
    """``VramHolder(budget)`` or, without a budget, a context that holds nothing (and yields None)."""

    return VramHolder(budget, device) if budget is not None else contextlib.nullcontext(None)


# ---- the holder process ---------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies; stop now if the parent is already gone."""

    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: end of file on stdin still ends the hold
    if os.getppid() != parent:
        sys.exit(0)


def _hold_main(argv: list[str]) -> int:

    budget, device, parent = int(argv[0]), int(argv[1]), int(argv[2])
    _die_with_parent(parent)

    def fail(message: str) -> int:
        print("ERROR " + message, flush=True)
        return 2

    lib = detect.cudart()
    if lib is None:
        return fail(
            "--vram-budget needs a CUDA GPU: no CUDA runtime (libcudart) found on this machine; "
            "run without --vram-budget"
        )
    count = ctypes.c_int(0)
    if lib.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value < 1:
        return fail("--vram-budget needs a CUDA GPU: the CUDA runtime sees none; run without --vram-budget")
    if not 0 <= device < count.value:
        return fail(f"GPU {device} does not exist ({count.value} CUDA device(s)): pick one with CUDA_VISIBLE_DEVICES")
    if lib.cudaSetDevice(device) != 0:
        return fail(f"cudaSetDevice({device}) failed: is the GPU in exclusive mode or busy?")
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.cudaFree(None)  # creates the context, so the free memory measured next already excludes it
    if lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        return fail("cudaMemGetInfo failed: the CUDA runtime does not answer")
    if free.value < budget:
        return fail(
            f"GPU {device} has {free.value / GIB:.1f} GiB free ({total.value / GIB:.1f} GiB in all), less than "
            f"the {budget / GIB:.1f} GiB budget: lower --vram-budget or free the GPU"
        )
    target = free.value - budget
    held, chunk, blocks = 0, GIB, []
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    while held < target and chunk >= _MIN_CHUNK:
        size = min(chunk, target - held)
        ptr = ctypes.c_void_p()
        if lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0:
            blocks.append(ptr)
            held += size
        else:
            chunk //= 2
    after = ctypes.c_size_t(0)
    lib.cudaMemGetInfo(ctypes.byref(after), ctypes.byref(total))
    print(f"READY {held} {free.value} {after.value} {total.value}", flush=True)
    sys.stdin.read()  # until xover closes the pipe or dies
    return 0


if __name__ == "__main__":
    sys.exit(_hold_main(sys.argv[1:]))
