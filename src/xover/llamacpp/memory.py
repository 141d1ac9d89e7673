"""Peak memory of a llama.cpp process: the buffers it logs and the peak resident set the kernel kept.

* **Buffers** (pure): llama.cpp logs every buffer it allocates, per device (``CPU_Mapped``,
  ``CUDA0``, ``CUDA_Host``...) and kind (``model``, ``KV``, ``compute``, ``output``)::

      load_tensors:   CPU_Mapped model buffer size =     4.18 MiB
      llama_kv_cache:        CPU KV buffer size =     4.00 MiB
      sched_reserve:      CUDA0 compute buffer size =   342.01 MiB

  ik_llama.cpp logs its model buffers without the kind (``llm_load_tensors:  CUDA_Host buffer size =
  8536.92 MiB``), at its llama-server's default verbosity; they count as ``model``.
  llama-bench prints them with ``-v`` (one set per model load and per test context), llama-server
  from log verbosity 4 (``-lv 4``). :func:`parse_buffer_lines` keeps the largest value of each
  (device, kind): the peak of a process whose contexts come and go one at a time.
* **Peak resident set** (I/O): ``VmHWM`` of ``/proc/<pid>/status``, read while the child is alive
  (it is gone once the child is reaped). It counts host memory only: mmapped weights the process
  touched, pinned host buffers, the CPU's own buffers; device memory shows in the buffers alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

MIB = 1 << 20
ARTIFACT = "memory"  # store artifact: {config_key, label, source, **MemoryUse.to_dict()} per configuration run
# A device is a backend buffer type's name: CPU_Mapped, CUDA0, CUDA_Host, or an RPC worker's RPC0[host:port].
_BUFFER = re.compile(
    r"(?P<dev>[\w.+-]+(?:\[[^\]\s]*\])?)\s+(?P<kind>model|KV|compute|output|RS)\s+buffer size\s*=\s*"
    r"(?P<mib>[\d.]+)\s*MiB"
)
_IK_MODEL_BUFFER = re.compile(
    r"llm_load_tensors:\s+(?P<dev>[\w.+-]+(?:\[[^\]\s]*\])?)\s+buffer size\s*=\s*(?P<mib>[\d.]+)\s*MiB"
)
_VMHWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.MULTILINE)


def is_host_device(device: str) -> bool:
    """Whether a llama.cpp buffer lives in host memory: ``CPU``, ``CPU_Mapped``, ``CPU_REPACK``,
    ``CUDA_Host`` (pinned host memory)... rather than on an accelerator (``CUDA0``, ``ROCm0``)."""
    return device.startswith("CPU") or device.endswith("_Host")


def is_remote_device(device: str) -> bool:
    """Whether a buffer lives on an RPC worker (``RPC0[10.0.0.2:50052]``): another process's memory, perhaps
    another machine's, counted neither as this host's nor as its accelerators'."""
    return device.startswith("RPC")


def is_local_accelerator(device: str) -> bool:
    """Whether a llama.cpp buffer lives on this host's accelerator (``CUDA0``, ``ROCm0``): neither host memory nor an
    RPC worker's."""
    return not is_host_device(device) and not is_remote_device(device)


@dataclasses.dataclass(frozen=True)
class MemoryUse:
    """Peak memory of one configuration's process. Missing is None (or no buffers), never 0."""

    peak_rss_bytes: int | None
    buffers: tuple[tuple[str, str, int], ...] = ()  # (device, kind, bytes): the largest logged of each

    @property
    def device_bytes(self) -> int | None:
        """This host's accelerator buffers together (model, KV, compute; an RPC worker's are not counted); None when
        none were logged."""
        found = [b for dev, _, b in self.buffers if is_local_accelerator(dev)]
        return sum(found) if found else None

    @property
    def host_buffer_bytes(self) -> int | None:
        found = [b for dev, _, b in self.buffers if is_host_device(dev)]
        return sum(found) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_rss_bytes": self.peak_rss_bytes,
            "buffers": [list(b) for b in self.buffers],
            "device_bytes": self.device_bytes,
            "host_buffer_bytes": self.host_buffer_bytes,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> MemoryUse:
        return MemoryUse(d.get("peak_rss_bytes"), tuple((str(a), str(b), int(c)) for a, b, c in d.get("buffers", ())))


def parse_buffer_lines(lines: Iterable[str]) -> tuple[tuple[str, str, int], ...]:
    """(device, kind, bytes) for every buffer a llama.cpp log mentions, the largest of each pair, in
    first-seen order. ``~llama_context: ... compute buffer size is X`` (a teardown check) is not a match."""
    peak: dict[tuple[str, str], int] = {}
    for line in lines:
        found = [(m["dev"], m["kind"], m["mib"]) for m in _BUFFER.finditer(line)]
        found += [(m["dev"], "model", m["mib"]) for m in _IK_MODEL_BUFFER.finditer(line)]
        for dev, kind, mib in found:
            peak[(dev, kind)] = max(peak.get((dev, kind), 0), round(float(mib) * MIB))
    return tuple((dev, kind, b) for (dev, kind), b in peak.items())


def parse_vmhwm(status: str) -> int | None:
    """Bytes of ``VmHWM`` in a ``/proc/<pid>/status`` text (None for a zombie, which has none)."""
    m = _VMHWM.search(status)
    return int(m.group(1)) * 1024 if m else None


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident set of a live process so far; None when it cannot be read (gone, not Linux)."""
    try:
        return parse_vmhwm(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return None


def buffer_lines_in(path: Path) -> list[str]:
    """The lines of a log file that report a buffer size (empty when the file cannot be read)."""
    try:
        with path.open(errors="replace") as f:
            return [line for line in f if "buffer size" in line]
    except OSError:
        return []
