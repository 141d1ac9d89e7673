"""Collect the provenance attached to every run: machine, llama.cpp build, model identity."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import socket
import time
from importlib import metadata
from pathlib import Path

from xover.domain.records import RPC_WORKER_KEY, ModelId, Provenance, backend_name
from xover.hardware.vram import active_hold, shortfall
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.process import run_short
from xover.llamacpp.rpc import active

# Enough to cover any realistic GGUF header (metadata + tensor table); a hash of this prefix
# identifies the model's shape, types and tokenizer without reading gigabytes of weights.
_HEADER_HASH_MAX = 64 << 20


def cpu_info() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_info() -> str | None:
    """GPU names from nvidia-smi or rocm-smi when present; None on CPU-only machines."""
    for cmd in (
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
        ["rocm-smi", "--showproductname"],
    ):
        if shutil.which(cmd[0]) is None:
            continue
        out = _output(cmd, 10)
        if out:
            return "; ".join(line.strip() for line in out.splitlines() if line.strip())
    return None


def model_id(path: Path) -> ModelId:
    size = path.stat().st_size
    h = hashlib.sha256()
    with path.open("rb") as f:
        remaining = min(size, _HEADER_HASH_MAX)
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            remaining -= len(chunk)
    return ModelId(path=str(path.resolve()), name=path.name, size_bytes=size, header_sha256=h.hexdigest())


def xover_version() -> str:
    try:
        return metadata.version("xover")
    except metadata.PackageNotFoundError:
        return "unknown"


def collect(
    binaries: Binaries | None,
    model: Path | None,
    build_info: dict[str, object] | None = None,
    engine: str | None = None,
    backend: str | None = None,
    devices: str | None = None,
    load: tuple[tuple[str, str], ...] | None = None,
) -> Provenance:
    """Provenance for a run. ``build_info`` comes from the binaries themselves (llama-bench's JSON
    record or llama-server's /props) and overrides what the build manifest says; ``engine`` names the engine where
    its binaries could not be found (default: the binaries' own); ``backend`` the backend its configurations asked
    for, where neither the record nor the build says. ``devices``: the devices the run's process used (llama-bench's
    ``gpu_info``, the devices a llama-server logged), kept with the driver of a GPU backend. ``load``: the
    machine's load as :func:`machine_load` sampled it before the run's first process started (default: sampled now,
    which is right only where no process of the run is computing)."""
    manifest = binaries.manifest if binaries else None
    info = build_info or {}
    built_for = manifest.backend if manifest else (binaries.backend if binaries else None)
    backend = built_for or backend
    commit = info.get("build_commit") or (manifest.commit[:7] if manifest else None)
    number = info.get("build_number")
    if number is None and manifest is not None:
        number = manifest.build_number
    return Provenance(
        llama_build_commit=str(commit) if commit else None,
        llama_build_number=int(str(number)) if number is not None else None,
        llama_backend=backend_name(str(info.get("backends") or backend or "")) or None,
        llama_bin_dir=str(binaries.bin_dir) if binaries else None,
        llama_bin_source=binaries.source if binaries else None,
        cpu_info=cpu_info(),
        gpu_info=gpu_info(),
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()} {platform.machine()}",
        xover_version=xover_version(),
        model=model_id(model) if model else None,
        extra=(load if load is not None else machine_load())
        + _vram_budget()
        + _rpc_workers()
        + _devices(backend, devices)
        + ((("boot_id", boot),) if (boot := boot_id()) else ()),
        llama_engine=binaries.engine if binaries else engine,
    )


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This boot of this machine (Linux's random boot id), or None where there is none: a run's machine session.
    Two leases of a lent GPU are two boots, whatever their hostname; a round of fresh servers begun in one is not
    finished in another (:func:`xover.measure.resume.rounds_of_other_sessions`)."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _devices(backend: str | None, devices: str | None) -> tuple[tuple[str, str], ...]:
    """The devices a run used and, for a GPU backend, their driver: what a number that names a backend ran on."""
    out = (("devices", devices),) if devices else ()
    driver = driver_info(backend) if backend not in (None, "cpu") else None
    return out + ((("driver", driver),) if driver else ())


_DRIVERS: dict[str, str | None] = {}


def driver_info(backend: str | None) -> str | None:
    """The driver a GPU backend runs on: NVIDIA's version (CUDA, and Vulkan on NVIDIA), Vulkan's driver name and
    info (``llvmpipe, Mesa 22.3.6 (LLVM 15.0.6)``), ROCm's; None where no tool says. Read once per process."""
    if backend is None or backend in _DRIVERS:
        return _DRIVERS.get(backend) if backend else None
    found: str | None = None
    if backend == "vulkan" and shutil.which("vulkaninfo"):
        found = _vulkan_driver()
    if found is None and backend in ("cuda", "vulkan") and shutil.which("nvidia-smi"):
        out = _output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        found = f"NVIDIA {out.splitlines()[0].strip()}" if out else None
    if found is None and backend == "hip" and shutil.which("rocm-smi"):
        out = _output(["rocm-smi", "--showdriverversion"])
        found = next(
            (ln.split(":", 1)[1].strip() for ln in out.splitlines() if "version" in ln.lower() and ":" in ln), None
        )
    _DRIVERS[backend] = found
    return found


def _output(cmd: list[str], timeout_s: float = 20) -> str:
    """A short tool's stdout, stripped ("" where it could not run or answer)."""
    return run_short(cmd, timeout_s)[1].strip()


def _vulkan_driver() -> str | None:
    """``driverName, driverInfo`` of each Vulkan device ``vulkaninfo --summary`` lists."""
    names, infos = [], []
    for line in _output(["vulkaninfo", "--summary"]).splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "driverName":
            names.append(value.strip())
        elif key.strip() == "driverInfo":
            infos.append(value.strip())
    found = [f"{n}, {i}" if i else n for n, i in zip(names, infos + [""] * len(names))]
    return "; ".join(dict.fromkeys(found)) or None


def _vram_budget() -> tuple[tuple[str, str], ...]:
    """The VRAM budget this process holds the GPU to, if any (:mod:`xover.hardware.vram`): every number measured
    under it answers for a card of that size, and the report says so."""

    hold = active_hold()
    if hold is None:
        return ()
    short = (("vram_shortfall", str(shortfall())),) if shortfall() else ()
    return tuple((f"vram_{k}", str(v)) for k, v in hold.as_dict().items() if k != "pid") + short


def _rpc_workers() -> tuple[tuple[str, str], ...]:
    """The RPC workers running for this study (:mod:`xover.llamacpp.rpc`), one entry each keyed by endpoint:
    a run whose command passes ``--rpc`` ran its layers on them; the entry says what each worker is."""

    return tuple((f"{RPC_WORKER_KEY}{w.endpoint}", w.describe()) for w in active())


def cpu_shares(stat_before: str, stat_after: str) -> tuple[float, float] | None:
    """The shares of all CPU time between two reads of /proc/stat (its first line) that were busy (not idle or
    waiting for I/O) and stolen (by the hypervisor, for other guests: a shared cloud machine's noise)."""

    def fields(text: str) -> list[int] | None:
        first = text.splitlines()[0].split() if text else []
        return [int(x) for x in first[1:]] if first and first[0] == "cpu" and len(first) > 5 else None

    a, b = fields(stat_before), fields(stat_after)
    if a is None or b is None:
        return None
    total = sum(b) - sum(a)
    if total <= 0:
        return None
    idle = (b[3] + b[4]) - (a[3] + a[4])  # idle + iowait
    steal = (b[7] - a[7]) if len(a) > 7 and len(b) > 7 else 0
    return max(0.0, min(1.0, 1 - idle / total)), max(0.0, min(1.0, steal / total))


def cpu_busy_share(stat_before: str, stat_after: str) -> float | None:
    """Share of all CPU time that was not idle between two reads of /proc/stat (its first line)."""
    shares = cpu_shares(stat_before, stat_after)
    return None if shares is None else shares[0]


def proc_stat() -> str:
    """/proc/stat as text ("" where there is none)."""

    try:
        return Path("/proc/stat").read_text()
    except OSError:
        return ""


def machine_load(sample_s: float = 0.25) -> tuple[tuple[str, str], ...]:
    """CPU count, load average and the CPU busy share over ``sample_s``, sampled before a run's first process
    starts: other work on the machine skews timings (badly so for multi-threaded runs on few cores), and the report
    says so. The load average lags by about a minute (it still counts a build that just ended); the busy share is
    what the CPUs were doing at the start. (Sampled while llama-bench computes, it is the run's own work: a bench
    run read 100% busy that way.)"""

    out = [("cpu_count", str(os.cpu_count()))]
    try:
        one, five, _ = os.getloadavg()
        out += [("loadavg_1m", f"{one:.2f}"), ("loadavg_5m", f"{five:.2f}")]
    except OSError:
        pass
    before = proc_stat()
    time.sleep(sample_s)
    shares = cpu_shares(before, proc_stat())
    if shares is not None:
        out += [("cpu_busy", f"{shares[0]:.2f}"), ("cpu_steal", f"{shares[1]:.3f}")]
    return tuple(out)
