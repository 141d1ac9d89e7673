"""Hardware profiles: the rates the theory needs, where each number came from, and how to get them.

The numbers live in frozen dataclasses (:class:`GpuSpec`, :class:`CpuSpec`, :class:`Hardware`) that the
pure theory (:mod:`xover.analysis.theory`) reads. Below them sit the I/O helpers: GPU detection
(``nvidia-smi`` / ``rocm-smi``), CPU detection (``/proc/cpuinfo``), quick micro-measurements and TOML
overrides. Every field of a :class:`Hardware` carries its source: ``built-in`` (the table here),
``detected``, ``measured`` or ``override`` (a TOML file).

Rates, all per second:

- ``fp16_flops_per_s``: the GPU's dense fp16 tensor-core peak (fp16 accumulate where GeForce halves the
  fp32-accumulate rate); the upper bound of any matmul.
- ``quant_flops_per_s``: what llama.cpp's quantized matmul kernels (MMQ, int8 tensor cores) reach on
  large batches of a dense model: about ``2 x params x pp512 t/s`` of a 7-8B Q4_0 model on that part.
  An estimate, typically 15-30 % of the fp16 peak on Hopper (MMQ does not use wgmma) and more on
  GeForce; override it with a TOML file once you have measured your own.
- ``h2d_pinned_bytes_per_s`` / ``h2d_pageable_bytes_per_s``: host-to-device copies from pinned memory
  (llama.cpp's CUDA host buffer, used with ``--no-mmap`` / ``-lm none``) and from pageable memory
  (mmapped weights, llama.cpp's default).
- CPU ``flops_per_s``: sustained matmul throughput of all cores (what a BLAS or llama.cpp's int8 dot
  products reach, not the vector-unit peak); ``mem_bw_bytes_per_s``: the bandwidth all cores together
  stream from memory.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xover.errors import XoverError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GB = 1e9
TFLOPS = 1e12
MIB = 1 << 20

BUILT_IN = "built-in"
DETECTED = "detected"
MEASURED = "measured"
OVERRIDE = "override"


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU: compute, memory and the host link. Rates in FLOP/s and bytes/s."""

    name: str
    backend: str  # the llama.cpp backend its users build: CUDA or HIP
    fp16_flops_per_s: float
    quant_flops_per_s: float
    mem_bw_bytes_per_s: float
    mem_bytes: int
    h2d_pinned_bytes_per_s: float
    h2d_pageable_bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class CpuSpec:
    """The host CPU: all cores together."""

    name: str
    cores: int
    flops_per_s: float
    mem_bw_bytes_per_s: float


@dataclasses.dataclass(frozen=True)
class Hardware:
    """A machine as the theory sees it; ``gpu`` is None on a CPU-only machine.

    ``sources`` maps each field (``gpu.mem_bw_bytes_per_s``, ``cpu.cores``...) to where its value came
    from: ``built-in``, ``detected``, ``measured`` or ``override``, with a detail after a colon.
    """

    name: str
    gpu: GpuSpec | None
    cpu: CpuSpec
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, field: str) -> str:
        return dict(self.sources).get(field, BUILT_IN)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": dataclasses.asdict(self.gpu) if self.gpu else None,
            "cpu": dataclasses.asdict(self.cpu),
            "sources": dict(self.sources),
        }


def hardware_from_dict(data: Mapping[str, Any]) -> Hardware:
    """The inverse of :meth:`Hardware.to_dict` (for stored predictions)."""
    gpu = data.get("gpu")
    return Hardware(
        name=str(data["name"]),
        gpu=GpuSpec(**gpu) if gpu else None,
        cpu=CpuSpec(**data["cpu"]),
        sources=tuple(sorted(dict(data.get("sources", {})).items())),
    )


# --------------------------------------------------------------------------------------------------
# the built-in table

# Host CPUs the GPU profiles assume until detection, --measure or a TOML file says otherwise.
# "server-16c" is what measure_cpu() gave on 16 cores of Sapphire Rapids beside an H200 (1.00 TFLOP/s
# fp32 sgemm, 92.5 GB/s threaded copy); the others are round figures for their class.
HOSTS: dict[str, CpuSpec] = {
    "server-16c": CpuSpec(name="server CPU, 16 cores", cores=16, flops_per_s=1.0 * TFLOPS, mem_bw_bytes_per_s=92 * GB),
    "desktop-16c": CpuSpec(name="desktop CPU, 16 cores, 2-channel DDR5", cores=16, flops_per_s=1.0 * TFLOPS,
                           mem_bw_bytes_per_s=70 * GB),
    "generic": CpuSpec(name="generic CPU, 8 cores, 2-channel DDR4/DDR5", cores=8, flops_per_s=0.4 * TFLOPS,
                       mem_bw_bytes_per_s=50 * GB),
}

# PCIe links: (pinned, pageable) host-to-device bytes/s as usually measured, not the line rate.
# Pageable copies go through the driver's staging buffers and depend on the host: 7.3 GB/s beside
# the H200 measured here (1 GiB torch copies; pinned 55.5 GB/s, device-to-device 4.2 TB/s).
_GEN4 = (25 * GB, 8 * GB)
_GEN5 = (53 * GB, 10 * GB)
_H200_HOST = (55.5 * GB, 7.3 * GB)


def _gpu(name: str, backend: str, fp16_t: float, quant_t: float, bw_gb: float, mem_gib: float,
         link: tuple[float, float]) -> GpuSpec:
    return GpuSpec(name=name, backend=backend, fp16_flops_per_s=fp16_t * TFLOPS, quant_flops_per_s=quant_t * TFLOPS,
                   mem_bw_bytes_per_s=bw_gb * GB, mem_bytes=int(mem_gib * (1 << 30)),
                   h2d_pinned_bytes_per_s=link[0], h2d_pageable_bytes_per_s=link[1])


@dataclasses.dataclass(frozen=True)
class Profile:
    """A built-in profile: a GPU (or none), its usual host, and the names ``nvidia-smi`` / ``rocm-smi`` print."""

    key: str
    gpu: GpuSpec | None
    host: str
    pattern: str  # regex matched (case-insensitive) against the detected GPU name


# Datasheet peaks (dense, no sparsity) and memory; quant_flops_per_s are estimates (module docstring).
PROFILES: dict[str, Profile] = {p.key: p for p in (
    Profile("h200", _gpu("NVIDIA H200", "CUDA", 989, 170, 4800, 140.4, _H200_HOST), "server-16c", r"\bH200\b"),
    Profile("h100-sxm", _gpu("NVIDIA H100 SXM", "CUDA", 989, 160, 3350, 79.6, _GEN5), "server-16c",
            r"\bH100\b(?!.*PCIe)"),
    Profile("h100-pcie", _gpu("NVIDIA H100 PCIe", "CUDA", 756, 120, 2000, 79.6, _GEN5), "server-16c",
            r"\bH100\b.*PCIe"),
    Profile("a100", _gpu("NVIDIA A100 80GB", "CUDA", 312, 100, 2039, 79.2, _GEN4), "server-16c", r"\bA100\b"),
    Profile("l40s", _gpu("NVIDIA L40S", "CUDA", 362, 150, 864, 44.4, _GEN4), "server-16c", r"\bL40S\b"),
    Profile("rtx-5090", _gpu("NVIDIA GeForce RTX 5090", "CUDA", 419, 250, 1792, 31.4, _GEN5), "desktop-16c",
            r"RTX 5090"),
    Profile("rtx-4090", _gpu("NVIDIA GeForce RTX 4090", "CUDA", 330, 170, 1008, 23.5, _GEN4), "desktop-16c",
            r"RTX 4090"),
    Profile("rtx-3090", _gpu("NVIDIA GeForce RTX 3090", "CUDA", 142, 70, 936, 23.5, _GEN4), "desktop-16c",
            r"RTX 3090"),
    Profile("rx-7900-xtx", _gpu("AMD Radeon RX 7900 XTX", "HIP", 123, 45, 960, 23.98, _GEN4), "desktop-16c",
            r"7900 XTX"),
    Profile("mi300x", _gpu("AMD Instinct MI300X", "HIP", 1307, 130, 5300, 191.5, _GEN5), "server-16c", r"MI300X"),
    Profile("mi250", _gpu("AMD Instinct MI250 (one GCD)", "HIP", 181, 50, 1600, 64, _GEN4), "server-16c", r"MI250"),
    Profile("mi210", _gpu("AMD Instinct MI210", "HIP", 181, 45, 1600, 64, _GEN4), "server-16c", r"MI210"),
    Profile("cpu", None, "generic", r"$^"),
)}


def builtin(key: str) -> Hardware:
    """A built-in profile by key (``h200``, ``rtx-4090``, ``cpu``...)."""
    try:
        p = PROFILES[key.lower()]
    except KeyError:
        raise XoverError(f"unknown hardware profile {key!r}: choose one of {', '.join(PROFILES)} or give a .toml file") from None
    return Hardware(name=p.key, gpu=p.gpu, cpu=HOSTS[p.host])


def match_profile(gpu_name: str) -> str | None:
    """The built-in profile key whose pattern matches a detected GPU name, if any."""
    return next((p.key for p in PROFILES.values() if re.search(p.pattern, gpu_name, re.IGNORECASE)), None)


# --------------------------------------------------------------------------------------------------
# pure edits: replace fields and record their source


def with_fields(hw: Hardware, part: str, values: Mapping[str, Any], source: str) -> Hardware:
    """``hw`` with fields of ``part`` (``gpu`` or ``cpu``) replaced and their sources set."""
    spec = hw.gpu if part == "gpu" else hw.cpu if part == "cpu" else None
    cls = GpuSpec if part == "gpu" else CpuSpec
    if part not in ("gpu", "cpu"):
        raise XoverError(f"hardware section [{part}] is unknown: use [gpu] or [cpu]")
    names = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise XoverError(f"[{part}] {unknown[0]} is not a hardware field: choose from {', '.join(names)}")
    typed: dict[str, Any] = {}
    for key, value in values.items():
        kind = str(names[key])
        if kind == "str":
            typed[key] = str(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise XoverError(f"[{part}] {key} = {value!r}: give a positive number (e.g. 4.8e12)")
        else:
            typed[key] = int(value) if kind == "int" else float(value)
    if spec is None:
        missing = sorted(set(names) - set(typed))
        if missing:
            raise XoverError(f"the profile has no GPU: a [gpu] section must set every field (missing {', '.join(missing)})")
        new_spec: Any = cls(**typed)
    else:
        new_spec = dataclasses.replace(spec, **typed)
    sources = dict(hw.sources)
    sources.update({f"{part}.{key}": source for key in typed})
    return dataclasses.replace(hw, **{part: new_spec}, sources=tuple(sorted(sources.items())))


def without_gpu(hw: Hardware, source: str) -> Hardware:
    """``hw`` as a CPU-only machine."""
    sources = {k: v for k, v in hw.sources if not k.startswith("gpu.")}
    sources["gpu"] = source
    return dataclasses.replace(hw, gpu=None, sources=tuple(sorted(sources.items())))


def apply_toml(hw: Hardware, data: Mapping[str, Any], name: str) -> Hardware:
    """Apply a parsed TOML override: optional ``base = "h200"``, then ``[gpu]`` / ``[cpu]`` fields.

    ``gpu = false`` at the top level makes the profile CPU-only.
    """
    unknown = sorted(set(data) - {"base", "gpu", "cpu", "name"})
    if unknown:
        raise XoverError(f"{name}: unknown key {unknown[0]!r}: use base, name, [gpu] and [cpu]")
    if "base" in data:
        hw = builtin(str(data["base"]))
    source = f"{OVERRIDE}:{name}"
    if data.get("gpu") is False:
        hw = without_gpu(hw, source)
    for part in ("gpu", "cpu"):
        section = data.get(part)
        if isinstance(section, Mapping):
            hw = with_fields(hw, part, section, source)
        elif section not in (None, False):
            raise XoverError(f"{name}: {part} must be a [{part}] table of fields")
    return dataclasses.replace(hw, name=str(data.get("name", f"{hw.name}+{Path(name).stem}")))


_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1e9, "gib": 1 << 30, "t": 1 << 40, "tb": 1e12, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """``16GiB``, ``24 GB``, ``16G`` (binary, as GPU memory is sold), ``15000MiB`` or a plain byte count."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise XoverError(f"{text!r} is not an amount of memory: write e.g. 16GiB, 24GB or 15000MiB")
    return int(float(m.group(1)) * _UNITS[unit])


# --------------------------------------------------------------------------------------------------
# I/O: detection, measurement, files


def _query(argv: list[str], timeout_s: float = 5.0) -> str | None:
    """Stdout of a short query tool, or None if it is missing, fails or hangs."""
    from xover.llamacpp.process import spawn, stop

    try:
        proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        stop(proc)
    return out if proc.returncode == 0 else None


@dataclasses.dataclass(frozen=True)
class DetectedGpu:
    name: str
    backend: str
    total_bytes: int | None
    free_bytes: int | None


def parse_nvidia_smi(text: str) -> DetectedGpu | None:
    """The first GPU of ``nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits``."""
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0]:
            total: int | None
            free: int | None
            try:
                total, free = int(float(parts[1])) * MIB, int(float(parts[2])) * MIB
            except ValueError:
                total = free = None  # "[N/A]" on some parts
            return DetectedGpu(parts[0], "CUDA", total, free)
    return None


def parse_rocm_smi(text: str) -> DetectedGpu | None:
    """The first card of ``rocm-smi --showproductname``: its "Card Series" (or "Card SKU") value."""
    for key in ("Card Series", "Card series", "Card SKU", "Card Model"):
        m = re.search(rf"{key}:\s*(.+)", text)
        if m and m.group(1).strip():
            return DetectedGpu(m.group(1).strip(), "HIP", None, None)
    return None


def detect_gpu() -> DetectedGpu | None:
    """The first NVIDIA or AMD GPU on this machine, with its free memory where the tool says."""
    out = _query(["nvidia-smi", "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"])
    gpu = parse_nvidia_smi(out) if out else None
    if gpu is None:
        out = _query(["rocm-smi", "--showproductname"])
        gpu = parse_rocm_smi(out) if out else None
    return gpu


def parse_cpuinfo(text: str) -> str | None:
    """The ``model name`` of /proc/cpuinfo (x86) or its ``Hardware``/``CPU part`` line elsewhere."""
    m = re.search(r"^(?:model name|Hardware|cpu model)\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def detect_cpu() -> tuple[str | None, int]:
    """The CPU's model name (None where unknown) and the cores this process may use."""
    try:
        name = parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        name = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return name, cores


def measure_cpu(budget_s: float = 2.0, copy_bytes: int = 512 * MIB) -> tuple[float, float]:
    """``(FLOP/s, bytes/s)`` of this CPU: a float32 numpy matmul and a threaded copy, each within half the budget.

    The matmul runs on numpy's BLAS with all its threads (fp32 sgemm, not llama.cpp's int8 dot products);
    the copy splits ``copy_bytes`` over one thread per core and counts bytes read plus bytes written.
    """
    import concurrent.futures

    import numpy as np

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
            list(pool.map(lambda lo_hi: np.copyto(dst[lo_hi[0]:lo_hi[1]], src[lo_hi[0]:lo_hi[1]]), bounds))

        copy_all()  # warm-up: first touch of dst
        count, start = 0, time.perf_counter_ns()
        while (elapsed := (time.perf_counter_ns() - start) / 1e9) < half:
            copy_all()
            count += 1
    bw = 2 * src.nbytes * count / elapsed
    return flops, bw


_CUDART_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                 "/usr/local/cuda/lib64/libcudart.so")


def _cudart() -> Any | None:
    """The CUDA runtime library through ctypes, or None where there is none (a CPU-only machine)."""
    import ctypes

    for name in _CUDART_NAMES:
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
    """
    import ctypes

    lib = _cudart()
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
        hw = with_fields(hw, "cpu", {"flops_per_s": flops, "mem_bw_bytes_per_s": bw}, f"{MEASURED}:numpy sgemm, threaded copy")
        hw = with_fields(hw, "cpu", {"name": name or hw.cpu.name, "cores": cores}, DETECTED)
        link = measure_h2d() if hw.gpu is not None else None
        if link is not None:
            hw = with_fields(hw, "gpu", {"h2d_pinned_bytes_per_s": link[0], "h2d_pageable_bytes_per_s": link[1]},
                             f"{MEASURED}:cudaMemcpy of 256 MiB, pinned and pageable")
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
