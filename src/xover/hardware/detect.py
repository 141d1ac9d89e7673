"""This machine's hardware, probed: GPU detection (``nvidia-smi`` / ``rocm-smi``), CPU detection
(``/proc/cpuinfo``), quick micro-measurements (CPU matmul and copy, host-to-device copies through the CUDA
runtime), and :func:`resolve`, which turns them and a profile or TOML file into a :class:`Hardware`. The
profiles and the parsers are pure and live in :mod:`xover.domain.profiles`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from xover.console import warn
from xover.domain.profiles import (  # noqa: F401
    BUILT_IN,
    DETECTED,
    MEASURED,
    MIB,
    DetectedGpu,
    Hardware,
    apply_toml,
    builtin,
    match_profile,
    parse_compute_apps,
    parse_cpu_flags,
    parse_cpuinfo,
    parse_nvidia_smi,
    parse_rocm_smi,
    with_fields,
    without_gpu,
)
from xover.errors import XoverError
from xover.llamacpp.process import run_short

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _run(argv: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """A short child's exit code, stdout and stderr (:func:`xover.llamacpp.process.run_short`)."""

    return run_short(argv, timeout_s)


def _query(argv: list[str], timeout_s: float = 5.0) -> str | None:
    """Stdout of a short query tool, or None if it is missing, fails or hangs."""
    code, out, _ = _run(argv, timeout_s)
    return out if code == 0 else None


def detect_gpu() -> DetectedGpu | None:
    """The first NVIDIA or AMD GPU on this machine, with its free memory where the tool says."""
    out = _query(["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"])
    gpu = parse_nvidia_smi(out) if out else None
    if gpu is None:
        out = _query(["rocm-smi", "--showproductname"])
        gpu = parse_rocm_smi(out) if out else None
    return gpu


def gpu_processes() -> list[tuple[int, int]]:
    """``(pid, bytes)`` of each process holding NVIDIA GPU memory now (empty without nvidia-smi)."""
    out = _query(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    return parse_compute_apps(out or "")


def gpu_count() -> int:
    """How many NVIDIA GPUs this machine has, whatever CUDA_VISIBLE_DEVICES says (``nvidia-smi -L``; 0 without it)."""
    out = _query(["nvidia-smi", "-L"])
    return sum(1 for line in (out or "").splitlines() if line.startswith("GPU "))


def detect_cpu() -> tuple[str | None, int]:
    """The CPU's model name (None where unknown) and the cores this process may use."""
    try:
        name = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        name = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return name, cores


def cpu_flags() -> frozenset[str]:
    """This CPU's instruction-set flags (``avx2``, ``avx512f``, ``amx_int8``; Arm ``asimddp``...), empty where
    /proc/cpuinfo cannot be read."""
    try:
        return parse_cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()


def measure_cpu(budget_s: float = 2.0, copy_bytes: int = 512 * MIB) -> tuple[float, float]:
    """``(FLOP/s, bytes/s)`` of this CPU: a float32 numpy matmul and a threaded copy, each within half the budget.

    The matmul runs on numpy's BLAS with all its threads (fp32 sgemm, not llama.cpp's int8 dot products);
    the copy splits ``copy_bytes`` over one thread per core and counts bytes read plus bytes written.
    """

    half = budget_s / 2
    n = 1024
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.copy()
    a @ b  # warm-up: thread pool start, page faults
    count, start = 0, time.perf_counter_ns()
    while (elapsed := (time.perf_counter_ns() - start) / 1e9) < half:
        a @ b
        count += 1
    flops = 2 * n**3 * count / elapsed
    _, cores = detect_cpu()
    src = np.ones(copy_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    chunks = np.array_split(np.arange(src.size), cores)
    bounds = [(int(c[0]), int(c[-1]) + 1) for c in chunks if c.size]
    with concurrent.futures.ThreadPoolExecutor(len(bounds)) as pool:

        def copy_all() -> None:
            list(pool.map(lambda lo_hi: np.copyto(dst[lo_hi[0] : lo_hi[1]], src[lo_hi[0] : lo_hi[1]]), bounds))

        copy_all()  # warm-up: first touch of dst
        count, start = 0, time.perf_counter_ns()
        while (elapsed := (time.perf_counter_ns() - start) / 1e9) < half:
            copy_all()
            count += 1
    bw = 2 * src.nbytes * count / elapsed
    return flops, bw


_CUDART_NAMES = (
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
    "/usr/local/cuda/lib64/libcudart.so",
)


def cudart() -> Any | None:
    """The CUDA runtime library through ctypes, or None where there is none (a CPU-only machine).
    ``XOVER_CUDART`` names another library to load instead (the tests' fake runtime with known answers)."""

    for name in (os.environ["XOVER_CUDART"],) if os.environ.get("XOVER_CUDART") else _CUDART_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def measure_h2d(budget_s: float = 2.0, copy_bytes: int = 256 * MIB) -> tuple[float, float] | None:
    """``(pinned, pageable)`` host-to-device bytes/s of GPU 0 with ``cudaMemcpy``, or None without CUDA.

    The pinned source is ``cudaMallocHost`` memory (what llama.cpp uses with ``-lm none``); the pageable
    one is ordinary touched memory (what mmapped weights in the page cache are to the driver), copied
    through the driver's staging buffers. One warm-up copy each, then as many as fit half the budget (at
    least 3); the fastest one gives the rate, since the theory uses it as a limit (pageable copies vary
    from copy to copy, and llama.cpp's own reached 6-8.5 GB/s beside a 6.3 GB/s average on the H200).

    It runs in a child process (``python -m xover.hardware.detect h2d``): a CUDA context lives as long as the
    process that made it, and one left in xover's own process (about 0.5 GiB on an H200) sits inside a VRAM budget
    for the rest of the study. On the H200 under 16 GiB it cost 524 MiB of the budget, and the defaults' servers ran
    out of memory at levels their checks had served (2026-12-03).
    """
    argv = [sys.executable, "-m", "xover.hardware.detect", "h2d", repr(budget_s), str(copy_bytes)]
    code, out, err = _run(argv, budget_s + 60)
    fields = out.split()
    if fields == ["NONE"]:  # no CUDA runtime or no GPU: nothing to measure
        return None
    if len(fields) != 3 or fields[0] != "H2D":  # it failed: say so, and the profile's rates stand
        why = next((x for x in reversed(err.splitlines()) if x.strip()), f"exit {code}")
        warn(f"host-to-device copies not measured ({why}): the profile's rates stand")
        return None
    return float(fields[1]), float(fields[2])


def _measure_h2d_here(budget_s: float, copy_bytes: int) -> tuple[float, float] | None:
    """The measurement itself, in the process that calls it (the child of :func:`measure_h2d`)."""

    lib = cudart()
    if lib is None:
        return None
    h2d = 1  # cudaMemcpyHostToDevice
    dev, pinned = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(copy_bytes)) != 0:
        return None
    try:
        if lib.cudaMallocHost(ctypes.byref(pinned), ctypes.c_size_t(copy_bytes)) != 0:
            return None
        try:
            ctypes.memset(pinned, 1, copy_bytes)
            pageable = (ctypes.c_char * copy_bytes)()
            ctypes.memset(pageable, 1, copy_bytes)  # touched: every page resident
            rates = []
            for src in (pinned, ctypes.cast(pageable, ctypes.c_void_p)):
                if lib.cudaMemcpy(dev, src, ctypes.c_size_t(copy_bytes), h2d) != 0:
                    return None
                best, count, start = float("inf"), 0, time.perf_counter_ns()
                while (time.perf_counter_ns() - start) / 1e9 < budget_s / 2 or count < 3:
                    t0 = time.perf_counter_ns()
                    lib.cudaMemcpy(dev, src, ctypes.c_size_t(copy_bytes), h2d)  # synchronous for both kinds
                    best = min(best, (time.perf_counter_ns() - t0) / 1e9)
                    count += 1
                rates.append(copy_bytes / best)  # the best copy: a limit, not a typical rate
            return rates[0], rates[1]
        finally:
            lib.cudaFreeHost(pinned)
    finally:
        lib.cudaFree(dev)


def resolve(spec: str | None = None, measure: bool = False) -> tuple[Hardware, DetectedGpu | None]:
    """The hardware to reason about, and the GPU detected here (for free VRAM), if any.

    ``spec`` is a built-in profile key, a ``.toml`` file, or None to detect this machine: its GPU's
    profile from the table (the GPU's name and memory are then ``detected``), the CPU's name and
    core count from /proc/cpuinfo with FLOP/s scaled from the built-in per-core figure. ``measure``
    replaces the CPU's FLOP/s and bandwidth with :func:`measure_cpu` and, where a GPU and the CUDA
    runtime are present, its host-to-device rates with :func:`measure_h2d`. A TOML file is applied last.
    """
    detected = detect_gpu()
    toml_path = Path(spec) if spec and spec.endswith(".toml") else None
    if spec and toml_path is None:
        hw = builtin(spec)
    else:
        hw = _detected(detected)
    if measure:
        flops, bw = measure_cpu()
        name, cores = detect_cpu()
        hw = with_fields(
            hw, "cpu", {"flops_per_s": flops, "mem_bw_bytes_per_s": bw}, f"{MEASURED}:numpy sgemm, threaded copy"
        )
        hw = with_fields(hw, "cpu", {"name": name or hw.cpu.name, "cores": cores}, DETECTED)
        link = measure_h2d() if hw.gpu is not None else None
        if link is not None:
            hw = with_fields(
                hw,
                "gpu",
                {"h2d_pinned_bytes_per_s": link[0], "h2d_pageable_bytes_per_s": link[1]},
                f"{MEASURED}:cudaMemcpy of 256 MiB, pinned and pageable",
            )
    if toml_path is not None:
        try:
            data = tomllib.loads(toml_path.read_text())
        except OSError as e:
            raise XoverError(f"--hw {toml_path}: cannot read ({e.strerror or e})") from None
        except tomllib.TOMLDecodeError as e:
            raise XoverError(f"--hw {toml_path}: not valid TOML ({e})") from None
        hw = apply_toml(hw, data, str(toml_path))
    return hw, detected


def _detected(gpu: DetectedGpu | None) -> Hardware:
    """This machine from detection alone: a known GPU's profile, else CPU-only."""
    key = match_profile(gpu.name) if gpu else None
    hw = builtin(key or "cpu")
    if key is None:
        hw = without_gpu(hw, f"{DETECTED}:" + (f"unknown GPU {gpu.name!r}" if gpu else "none found"))
    if gpu is not None and key is None:
        hw = dataclasses.replace(hw, name=f"unknown GPU {gpu.name!r} (treated as CPU-only)")
    if gpu is not None and key is not None:
        fields: dict[str, Any] = {"name": gpu.name}
        if gpu.total_bytes:
            fields["mem_bytes"] = gpu.total_bytes
        hw = with_fields(hw, "gpu", fields, DETECTED)
    name, cores = detect_cpu()
    per_core = hw.cpu.flops_per_s / hw.cpu.cores
    hw = with_fields(hw, "cpu", {"name": name or hw.cpu.name, "cores": cores}, DETECTED)
    hw = with_fields(hw, "cpu", {"flops_per_s": per_core * cores}, f"{BUILT_IN}:per-core figure x {cores} cores")
    return dataclasses.replace(hw, name=f"this machine ({hw.name})")


def _h2d_main(argv: list[str]) -> int:
    rates = _measure_h2d_here(float(argv[0]), int(argv[1]))
    print("NONE" if rates is None else f"H2D {rates[0]!r} {rates[1]!r}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["h2d"]:
        sys.exit(_h2d_main(sys.argv[2:]))
    sys.exit(f"usage: python -m xover.hardware.detect h2d BUDGET_S COPY_BYTES (got {sys.argv[1:]})")
