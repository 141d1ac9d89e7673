"""A run under a VRAM budget: the planner's view of each configuration before llama.cpp's.

:mod:`xover.hardware.vram` makes the card look ``budget`` bytes large; this module says, before any
server starts, which configurations the placement planner expects to fit, so a configuration that
llama.cpp then fails to load is explained, not just recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xover.analysis.theory import memory_estimate, model_terms, plan_placement
from xover.gguf.inspect import model_table

GIB = 1 << 30


def _plan(model: Path, n_ctx: int, budget: int, ubatch: int) -> tuple[Any, Any]:
    """The model's terms and the planner's placement for one context under ``budget``."""

    terms = model_terms(model_table(str(model))[0])
    (plan,) = plan_placement(terms, budget, (n_ctx,), ubatch)
    return terms, plan


def planner_notes(model: Path, n_cpu_moe: Sequence[int], n_ctx: int, budget: int, ubatch: int = 512) -> list[str]:
    """One line per configuration the planner expects NOT to fit ``budget`` at ``n_ctx`` tokens of context,
    naming the smallest ``--n-cpu-moe`` that does; nothing for those that fit."""

    terms, plan = _plan(model, n_ctx, budget, ubatch)
    out = []
    for n in sorted(set(n_cpu_moe)):
        need = memory_estimate(terms, n, n_ctx, ubatch, True).total_bytes + plan.headroom_bytes
        if need > budget:
            fits = (
                f"the smallest that fits is --n-cpu-moe {plan.n_cpu_moe}"
                if plan.n_cpu_moe is not None
                else "nothing fits, even with every expert on the CPU"
            )
            out.append(
                f"planner: --n-cpu-moe {n} needs about {need / GIB:.1f} GiB of GPU memory at {n_ctx:,} tokens of "
                f"context, over the {budget / GIB:.1f} GiB budget ({fits}); llama.cpp is expected to fail to load it"
            )
    return out
