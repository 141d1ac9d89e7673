"""The "fit" section: each ``n-cpu-moe = "fit"`` configuration's level as the placement planner chose it under
the study's VRAM budget, and what llama.cpp did at that level and one below (artifacts ``fit`` and ``fit-check``,
written by :mod:`xover.measure.fit`)."""

from __future__ import annotations

from typing import Any

from xover.report.blocks import Block, table
from xover.results.read_model import StudyData

GIB = 1 << 30


def _did(check: dict[str, Any] | None) -> str:
    if check is None:
        return "-"
    if check["served"]:
        return "loads and serves"
    what = "loads, fails its first request" if check["loaded"] else "does not load"
    return f"{what}: {str(check['reason'] or '')[:200]}"


def fit_blocks(data: StudyData) -> list[Block]:
    checked = data.artifact_bodies("fit-check")
    chosen = checked[-1] if checked else (data.artifact_bodies("fit") or [[]])[-1]
    if not chosen:
        return []
    rows = []
    for r in chosen:
        by_level = {c["n_cpu_moe"]: c for c in r.get("checks", [])}
        n, e = int(r["n_cpu_moe"]), r["estimate"]
        rows.append(
            (
                r["config"],
                str(r["request"]),
                f"{r['n_ctx']:,}",
                f"{r['budget_bytes'] / GIB:.1f} GiB",
                str(n),
                f"{e['total_bytes'] / GIB:.2f} GiB + {r['headroom_bytes'] / GIB:.1f} GiB headroom",
                _did(by_level.get(n)),
                _did(by_level.get(n - 1)),
            )
        )
    return [
        Block("h2", "Fit: the smallest --n-cpu-moe that holds the context"),
        Block(
            "p",
            "The placement planner's level for each 'fit' configuration (llama.cpp's buffer arithmetic: model, "
            "KV and compute buffers, plus headroom for the CUDA context and the first request's allocations), "
            "then llama.cpp itself at that level and one below: llama-server started with the same context "
            "under the same budget, answering one ubatch-long request.",
        ),
        table(
            (
                "config",
                "asked",
                "context",
                "budget",
                "planner's level",
                "planner's GPU buffers",
                "llama.cpp at that level",
                "one level below",
            ),
            rows,
        ),
    ]
