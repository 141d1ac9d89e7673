"""What llama.cpp's own ``--fit`` would choose: ``llama-fit-params`` run on the model, its answer parsed.

llama-server and llama-bench fit unset placement options to the free device memory by default (``-fit on``):
they lower ``-ngl`` and move the experts of the highest layers to the CPU until the projected use leaves
``--fit-target`` (1024 MiB by default) free. ``llama-fit-params`` runs the same code without loading the weights
and prints the resulting arguments on one line::

    -c 32768 -ngl 49 -ot "blk\\.30\\.ffn_(up|down|gate)_(ch|)exps=CPU,blk\\.31\\.ffn_(up|down|gate)_(ch|)exps=CPU"

Under a VRAM budget (xover holds the rest of the card) it sees the budget, like every llama process of the run.
``--n-cpu-moe N`` moves the experts of the *first* N layers; llama.cpp's fit moves those of the *last* layers, so
the two are compared by the number of layers whose experts leave the GPU (:attr:`FitChoice.cpu_expert_layers`).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path
from typing import Any

from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.llamacpp import process

# The options of a configuration that change what the fit must hold (batch sizes, attention, KV types); the
# placement it decides itself (-ngl, --n-cpu-moe, -ot) is never passed, and others may not be valid for the tool.
_SIZING = ("ubatch-size", "batch-size", "flash-attn", "cache-type-k", "cache-type-v")
_LAYER = re.compile(r"blk\\*\.(\d+)\\*\.")


@dataclasses.dataclass(frozen=True)
class FitChoice:
    """llama-fit-params' answer: the context, ``-ngl`` and the layers whose experts it sends to the CPU."""

    args: str  # the printed line, untouched
    n_ctx: int | None
    n_gpu_layers: int | None
    cpu_expert_layers: tuple[int, ...]  # layer indices named in its -ot overrides (to the CPU)
    partial_layers: tuple[int, ...]  # of those, layers with only some of their expert tensors moved

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FitChoice:
        return cls(
            args=str(d["args"]),
            n_ctx=d.get("n_ctx"),
            n_gpu_layers=d.get("n_gpu_layers"),
            cpu_expert_layers=tuple(d.get("cpu_expert_layers", ())),
            partial_layers=tuple(d.get("partial_layers", ())),
        )

    def describe(self) -> str:
        n = len(self.cpu_expert_layers)
        part = f", {len(self.partial_layers)} of them in part" if self.partial_layers else ""
        return f"experts of {n} layer{'s' if n != 1 else ''} on the CPU{part} (-ngl {self.n_gpu_layers})"


def parse_fit_args(stdout: str) -> FitChoice | None:
    """The line llama-fit-params prints (``-c N -ngl N [-ts ...] [-ot "..."]``), or None when there is none."""
    line = next((ln.strip() for ln in reversed(stdout.splitlines()) if ln.strip().startswith("-c ")), None)
    if line is None:
        return None
    c = re.search(r"(?:^|\s)-c\s+(\d+)", line)
    ngl = re.search(r"(?:^|\s)-ngl\s+(-?\d+)", line)
    ot = re.search(r'-ot\s+"([^"]*)"', line)
    layers: dict[int, set[str]] = {}
    for item in ot.group(1).split(",") if ot else []:
        pattern, _, buft = item.rpartition("=")
        m = _LAYER.search(pattern)
        if m is None or not buft.upper().startswith("CPU"):
            continue
        layers.setdefault(int(m.group(1)), set()).update(_projections(pattern))
    full = {"up", "down", "gate"}
    return FitChoice(
        args=line,
        n_ctx=int(c.group(1)) if c else None,
        n_gpu_layers=int(ngl.group(1)) if ngl else None,
        cpu_expert_layers=tuple(sorted(layers)),
        partial_layers=tuple(sorted(i for i, p in layers.items() if not full <= p)),
    )


def _projections(pattern: str) -> set[str]:
    """The expert projections an override pattern names: ``ffn_(up|down|gate_up|gate)_(ch|)exps`` ->
    {up, down, gate_up, gate}; ``ffn_up_exps`` -> {up}; no group: all three."""
    group = re.search(r"ffn_\(([^)]*)\)", pattern)
    if group:
        return set(group.group(1).split("|"))
    single = re.search(r"ffn_([a-z_]+?)_(?:\(ch\|\)|ch)?exps", pattern)
    return {single.group(1)} if single else {"up", "down", "gate"}


def fit_args(config: LlamaConfig) -> list[str]:
    """A configuration's arguments that llama-fit-params should see: those that size its buffers."""
    out: list[str] = []
    for name in _SIZING:
        value = config.get(name)
        if value is not None:
            out += opts.BY_NAME[name].server_args(value)
    return out


def run_fit_params(
    exe: Path, model: Path, n_ctx: int, config: LlamaConfig, timeout_s: float = 300.0
) -> tuple[FitChoice | None, str]:
    """Run llama-fit-params for ``model`` at ``n_ctx``; its parsed answer and the tail of its log (why not). Like
    every llama.cpp process of xover's, it is tracked and dies with xover (:func:`xover.llamacpp.process.spawn`)."""

    argv = [str(exe), "-m", str(model), "-c", str(n_ctx), *fit_args(config)]
    try:
        child = process.spawn(
            argv,
            env=dict(config.environment()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=False,
            die_with_parent=True,
        )
    except OSError as e:
        return None, f"llama-fit-params did not answer: {e}"
    try:
        out_b, err_b = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.stop(child)
        return None, f"llama-fit-params did not answer within {timeout_s:.0f} s"
    process.forget(child)
    proc = subprocess.CompletedProcess(
        argv, child.returncode, out_b.decode(errors="replace"), err_b.decode(errors="replace")
    )
    choice = parse_fit_args(proc.stdout) if proc.returncode == 0 else None
    tail = " | ".join(ln.strip() for ln in proc.stderr.splitlines() if "fit" in ln.lower())[-600:]
    return choice, tail or proc.stderr[-300:]
