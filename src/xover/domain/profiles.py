"""Hardware profiles: the rates the theory needs, where each number came from, and how to get them.

The numbers live in frozen dataclasses (:class:`GpuSpec`, :class:`CpuSpec`, :class:`Hardware`) that the
pure theory (:mod:`xover.analysis.theory`) reads, with the parsers of what the probes read and TOML
overrides; the probes (GPU and CPU detection, micro-measurements) are in :mod:`xover.hardware.detect`. Every field of a :class:`Hardware` carries its source: ``built-in`` (the table here),
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
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xover.errors import XoverError

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
    "desktop-16c": CpuSpec(
        name="desktop CPU, 16 cores, 2-channel DDR5", cores=16, flops_per_s=1.0 * TFLOPS, mem_bw_bytes_per_s=70 * GB
    ),
    # A DDR4 desktop of the RTX 3090 generation (a 12-core Ryzen 5900X class, dual-channel DDR4-3200: about
    # 40 GB/s threaded copy in practice): round figures for the class, like the others.
    "desktop-ddr4-12c": CpuSpec(
        name="desktop CPU, 12 cores, 2-channel DDR4", cores=12, flops_per_s=0.7 * TFLOPS, mem_bw_bytes_per_s=40 * GB
    ),
    "generic": CpuSpec(
        name="generic CPU, 8 cores, 2-channel DDR4/DDR5", cores=8, flops_per_s=0.4 * TFLOPS, mem_bw_bytes_per_s=50 * GB
    ),
}

# PCIe links: (pinned, pageable) host-to-device bytes/s as usually measured, not the line rate.
# Pageable copies go through the driver's staging buffers and depend on the host: 7.3 GB/s beside
# the H200 measured here (1 GiB torch copies; pinned 55.5 GB/s, device-to-device 4.2 TB/s).
_GEN4 = (25 * GB, 8 * GB)
_GEN5 = (53 * GB, 10 * GB)
_H200_HOST = (55.5 * GB, 7.3 * GB)


def _gpu(
    name: str, backend: str, fp16_t: float, quant_t: float, bw_gb: float, mem_gib: float, link: tuple[float, float]
) -> GpuSpec:
    return GpuSpec(
        name=name,
        backend=backend,
        fp16_flops_per_s=fp16_t * TFLOPS,
        quant_flops_per_s=quant_t * TFLOPS,
        mem_bw_bytes_per_s=bw_gb * GB,
        mem_bytes=int(mem_gib * (1 << 30)),
        h2d_pinned_bytes_per_s=link[0],
        h2d_pageable_bytes_per_s=link[1],
    )


@dataclasses.dataclass(frozen=True)
class Profile:
    """A built-in profile: a GPU (or none), its usual host, and the names ``nvidia-smi`` / ``rocm-smi`` print."""

    key: str
    gpu: GpuSpec | None
    host: str
    pattern: str  # regex matched (case-insensitive) against the detected GPU name


def _desktop(
    key: str,
    name: str,
    fp16_t: float,
    quant_t: float,
    bw_gb: float,
    mem_gib: float,
    link: tuple[float, float],
    pattern: str,
    backend: str = "CUDA",
) -> Profile:
    """A desktop card, with the 16-core desktop host."""
    return Profile(key, _gpu(name, backend, fp16_t, quant_t, bw_gb, mem_gib, link), "desktop-16c", pattern)


# Datasheet peaks (dense, no sparsity) and memory; quant_flops_per_s are estimates (module docstring).
PROFILES: dict[str, Profile] = {
    p.key: p
    for p in (
        Profile("h200", _gpu("NVIDIA H200", "CUDA", 989, 170, 4800, 140.4, _H200_HOST), "server-16c", r"\bH200\b"),
        Profile(
            "h100-sxm",
            _gpu("NVIDIA H100 SXM", "CUDA", 989, 160, 3350, 79.6, _GEN5),
            "server-16c",
            r"\bH100\b(?!.*PCIe)",
        ),
        Profile(
            "h100-pcie", _gpu("NVIDIA H100 PCIe", "CUDA", 756, 120, 2000, 79.6, _GEN5), "server-16c", r"\bH100\b.*PCIe"
        ),
        Profile("a100", _gpu("NVIDIA A100 80GB", "CUDA", 312, 100, 2039, 79.2, _GEN4), "server-16c", r"\bA100\b"),
        Profile("l40s", _gpu("NVIDIA L40S", "CUDA", 362, 150, 864, 44.4, _GEN4), "server-16c", r"\bL40S\b"),
        _desktop("rtx-5090", "NVIDIA GeForce RTX 5090", 419, 250, 1792, 31.4, _GEN5, r"RTX 5090"),
        _desktop("rtx-5080", "NVIDIA GeForce RTX 5080", 225, 130, 960, 15.92, _GEN5, r"RTX 5080"),
        _desktop("rtx-4080", "NVIDIA GeForce RTX 4080", 195, 100, 717, 15.99, _GEN4, r"RTX 4080"),
        _desktop("rtx-4090", "NVIDIA GeForce RTX 4090", 330, 170, 1008, 23.5, _GEN4, r"RTX 4090"),
        _desktop("rtx-3090", "NVIDIA GeForce RTX 3090", 142, 70, 936, 23.5, _GEN4, r"RTX 3090"),
        _desktop("rx-7900-xtx", "AMD Radeon RX 7900 XTX", 123, 45, 960, 23.98, _GEN4, r"7900 XTX", "HIP"),
        Profile("mi300x", _gpu("AMD Instinct MI300X", "HIP", 1307, 130, 5300, 191.5, _GEN5), "server-16c", r"MI300X"),
        Profile("mi250", _gpu("AMD Instinct MI250 (one GCD)", "HIP", 181, 50, 1600, 64, _GEN4), "server-16c", r"MI250"),
        Profile("mi210", _gpu("AMD Instinct MI210", "HIP", 181, 45, 1600, 64, _GEN4), "server-16c", r"MI210"),
        Profile("cpu", None, "generic", r"$^"),
    )
}


def builtin(key: str) -> Hardware:
    """A built-in profile by key (``h200``, ``rtx-4090``, ``cpu``...)."""
    try:
        p = PROFILES[key.lower()]
    except KeyError:
        raise XoverError(
            f"unknown hardware profile {key!r}: choose one of {', '.join(PROFILES)} or give a .toml file"
        ) from None
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
            raise XoverError(
                f"the profile has no GPU: a [gpu] section must set every field (missing {', '.join(missing)})"
            )
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


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "kib": 1 << 10,
    "m": 1e6,
    "mb": 1e6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1e9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1e12,
    "tib": 1 << 40,
}


def parse_bytes(text: str) -> int:
    """``16GiB``, ``24 GB``, ``16G`` (binary, as GPU memory is sold), ``15000MiB`` or a plain byte count."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise XoverError(f"{text!r} is not an amount of memory: write e.g. 16GiB, 24GB or 15000MiB")
    return int(float(m.group(1)) * _UNITS[unit])


# --------------------------------------------------------------------------------------------------
# Pure parsers of what the probes read (the probes themselves are in :mod:`xover.hardware.detect`)


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


def parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """``(pid, bytes)`` of each process holding GPU memory, from ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits``; lines it cannot read ("[N/A]" memory in some containers) are left out."""
    apps = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            apps.append((int(parts[0]), int(parts[1]) * MIB))
    return apps


def parse_rocm_smi(text: str) -> DetectedGpu | None:
    """The first card of ``rocm-smi --showproductname``: its "Card Series" (or "Card SKU") value."""
    for key in ("Card Series", "Card series", "Card SKU", "Card Model"):
        m = re.search(rf"{key}:\s*(.+)", text)
        if m and m.group(1).strip():
            return DetectedGpu(m.group(1).strip(), "HIP", None, None)
    return None


def parse_cpuinfo(text: str) -> str | None:
    """The ``model name`` of /proc/cpuinfo (x86) or its ``Hardware``/``CPU part`` line elsewhere."""
    m = re.search(r"^(?:model name|Hardware|cpu model)\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def parse_cpu_flags(text: str) -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo's first processor (x86 ``flags``, Arm ``Features``), lower-case;
    empty where the file names none."""
    m = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(m.group(1).lower().split()) if m else frozenset()
