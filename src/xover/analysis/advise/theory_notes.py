"""What the theory (:mod:`xover.analysis.theory`) expects of each trial of a search, with a note per knob. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from xover.analysis import theory
from xover.analysis.advise.knobs import DEFAULTS, LLAMA_DEFAULT_BATCH, Knob, Setting, is_again, knob_named, llama_config
from xover.analysis.advise.search import Search
from xover.analysis.advise.workload import Turn, Workload
from xover.domain.profiles import without_gpu

if TYPE_CHECKING:
    from xover.analysis.theory import ModelTerms, Offload
    from xover.domain.profiles import Hardware

THEORY_NO_EFFECT = 0.005  # a predicted change below 0.5 % counts as none


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What the theory expects of one trial against the defaults at the same offload level."""

    n_cpu_moe: int | None
    setting: Setting
    change: float | None  # predicted time per turn / defaults'; None: the theory does not model it
    note: str


def _mb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def expectations(
    terms: ModelTerms, hw: Hardware, knobs: Sequence[Knob], search: Search, workload: Workload, gpu_build: bool
) -> tuple[Expectation, ...]:
    """The theory's expected change for each trial of a search (:mod:`xover.analysis.theory` with the
    :mod:`xover.domain.profiles` profile ``hw``; ``gpu_build`` False: a CPU-only llama.cpp build)."""
    if not gpu_build and hw.gpu is not None:
        hw = without_gpu(hw, "llama.cpp build without a GPU backend")
    n = search.n_cpu_moe or 0
    offload = _offload(knobs, n)
    turn_s = expected_turn_s(terms, hw, knobs, n, workload, gpu_build)

    base_cfg, base_s = offload(DEFAULTS), turn_s(DEFAULTS)
    out = []
    for trial in search.trials:
        if trial.setting == DEFAULTS or is_again(trial.setting):
            continue
        cfg = offload(trial.setting)
        names = [name for name, _ in trial.setting]
        modelled = "threads" not in names
        change = turn_s(trial.setting) / base_s if modelled else None
        notes = [
            _knob_note(terms, hw, n, base_cfg, cfg, name, value, knobs)
            for name, value in trial.setting
            if not (name == "batch-size" and "ubatch-size" in names)
        ]
        out.append(Expectation(search.n_cpu_moe, trial.setting, change, "; ".join(notes)))
    return tuple(out)


def _offload(knobs: Sequence[Knob], n: int) -> Callable[[Setting], Offload]:
    def offload(setting: Setting) -> Offload:
        config = llama_config(knobs, setting, n, "theory")
        cfg = theory.offload_of(config)
        batch = int(dict(setting).get("batch-size", LLAMA_DEFAULT_BATCH))
        return dataclasses.replace(cfg, ubatch=min(cfg.ubatch, batch))

    return offload


def expected_turn_s(
    terms: ModelTerms, hw: Hardware, knobs: Sequence[Knob], n_cpu_moe: int, workload: Workload, gpu_build: bool
) -> Callable[[Setting], float]:
    """The theory's expected time per turn of a setting over ``workload`` at offload level ``n_cpu_moe``: what a
    search's trial is held against, and how a plan ranks the values it may leave out."""
    if not gpu_build and hw.gpu is not None:
        hw = without_gpu(hw, "llama.cpp build without a GPU backend")
    offload = _offload(knobs, n_cpu_moe)

    def turn_s(setting: Setting) -> float:
        cfg = offload(setting)

        def one(t: Turn) -> float:
            p = theory.predict_point(terms, hw, cfg, t.length, t.response)
            return p.ttft_s + t.response / p.decode_tps

        return workload.expected(one)

    return turn_s


def _knob_note(
    terms: ModelTerms, hw: Hardware, n: int, base: Offload, cfg: Offload, name: str, value: str, knobs: Sequence[Knob]
) -> str:
    knob = knob_named(knobs, name)
    if name == "threads":
        return f"threads not modelled: the theory assumes all {hw.cpu.cores} cores"
    if knob is not None and knob.gpu_only and hw.gpu is None:
        return f"{knob.short}={value}: no effect expected on a CPU-only build (nothing is copied to a GPU)"
    gpu = hw.gpu
    copies = gpu is not None and n > 0
    if name == "ubatch-size":
        ub = cfg.ubatch
        pad = ""
        if gpu is not None and terms.n_expert and theory.pads_expert_tiles(gpu.name):
            pad = (
                f"; GPU expert matmuls pad to {theory.expert_tile_padding(ub, terms.n_expert, terms.n_expert_used):.2f}x "
                f"their work vs {theory.expert_tile_padding(base.ubatch, terms.n_expert, terms.n_expert_used):.2f}x "
                "(MMQ tiles)"
            )
        if not copies:
            cover = theory.coverage(ub, terms.n_expert, terms.n_expert_used)
            return f"ub={ub}: weights read once per {ub} tokens (experts {cover:.0%} covered) vs {base.ubatch}{pad}"
        per_tok = theory.expert_transfer_bytes(terms, n, ub) / ub
        base_tok = theory.expert_transfer_bytes(terms, n, base.ubatch) / base.ubatch
        return (
            f"ub={ub}: op offload copies {_mb(per_tok * 1e3)} of CPU-resident experts per 1K prompt tokens vs "
            f"{_mb(base_tok * 1e3)} at {base.ubatch}{pad}"
        )
    if name == "batch-size":
        return (
            f"b={value}: caps the ubatch at {value}"
            if int(value) < base.ubatch
            else f"b={value}: no effect expected (ubatches stay {cfg.ubatch} tokens; the batch only caps them)"
        )
    if gpu is None or n == 0:
        return (
            f"{knob.short if knob else name}={value}: no effect expected: no experts in host memory at --n-cpu-moe {n}"
        )
    moved = theory.expert_transfer_bytes(terms, n, cfg.ubatch)
    if name == "load-mode":
        if value != "none":
            return f"lm={value}: mmapped (pageable) weights, as the default"
        return (
            f"lm=none: {_mb(moved)} per {cfg.ubatch}-token ubatch from pinned memory at {gpu.h2d_pinned_bytes_per_s / 1e9:.1f} GB/s: "
            f"{moved / gpu.h2d_pinned_bytes_per_s * 1e3:.0f} ms vs {moved / gpu.h2d_pageable_bytes_per_s * 1e3:.0f} ms "
            f"pageable at {gpu.h2d_pageable_bytes_per_s / 1e9:.1f} GB/s"
        )
    if name == "no-op-offload":
        if value != "1":
            return "nopo=0: op offload on, as the default"
        flops = 2.0 * cfg.ubatch * terms.active_fraction * sum(terms.expert_params_layer[:n])
        cpu_s = max(flops / hw.cpu.flops_per_s, moved / hw.cpu.mem_bw_bytes_per_s)
        rate = gpu.h2d_pinned_bytes_per_s if base.pinned else gpu.h2d_pageable_bytes_per_s
        return (
            f"nopo=1: CPU-resident experts of each {cfg.ubatch}-token ubatch computed on the CPU, "
            f"{cpu_s * 1e3:.0f} ms vs copying {_mb(moved)} in {moved / rate * 1e3:.0f} ms; decode unchanged"
        )
    if name == "GGML_OP_OFFLOAD_MIN_BATCH":
        threshold = int(value)
        if cfg.ubatch < threshold:
            return f"GGML_OP_OFFLOAD_MIN_BATCH={threshold}: {cfg.ubatch}-token ubatches stay on the CPU, like nopo=1"
        return (
            f"GGML_OP_OFFLOAD_MIN_BATCH={threshold}: {cfg.ubatch}-token ubatches are still copied: no change expected"
        )
    return f"{name}={value}: not modelled"
