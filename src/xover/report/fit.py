"""The "fit" section: each ``n-cpu-moe = "fit"`` configuration's level as the placement planner chose it under
the study's VRAM budget, and what llama.cpp did at that level and one below (artifacts ``fit`` and ``fit-check``,
written by :mod:`xover.measure.fit`)."""

from __future__ import annotations

from xover.domain.artifacts import FitLevelCheck, FitRecord
from xover.report.blocks import Block, table
from xover.results.read_model import StudyData, fit_placements

GIB = 1 << 30
MIB = 1 << 20


def _did(check: FitLevelCheck | None) -> str:
    if check is None:
        return "-"
    if check.served:
        return "loads and serves"
    what = "loads, fails its first request" if check.loaded else "does not load"
    return f"{what}: {(check.reason or '')[:200]}"


def _llama_fit(r: FitRecord) -> str:
    if not r.llama_fit_asked:
        return "-"  # a build without llama-fit-params
    own = r.llama_fit
    if own is None:
        return f"no answer: {r.llama_fit_log[:160]}"
    n = len(own.cpu_expert_layers)
    part = f" ({len(own.partial_layers)} in part)" if own.partial_layers else ""
    return f"experts of {n} layers on the CPU{part}, -ngl {own.n_gpu_layers}"


def _compute(r: FitRecord, check: FitLevelCheck | None) -> str:
    """The planner's compute buffer against the one llama.cpp logged at the level measured."""
    planned = f"{r.estimate.compute_bytes / MIB:,.0f} MiB"
    if check is None or check.compute_bytes is None:
        return f"{planned} / -"
    return f"{planned} / {check.compute_bytes / MIB:,.0f} MiB"


def _asked(r: FitRecord) -> str:
    """The levels a server placement asked, in order, and what each did."""
    return "; ".join(
        f"{c.n_cpu_moe}: {'serves' if c.served else ('fails its first request' if c.loaded else 'does not load')}"
        for c in r.checks
    )


def _server_blocks(placed: list[FitRecord]) -> list[Block]:
    """The tuned variants placed by their own llama-server: the planner's, llama-bench's and the server's level."""
    rows = [
        (
            r.config,
            f"{r.n_ctx:,}",
            f"{r.budget_bytes / GIB:.1f} GiB",
            str(r.ubatch),
            "-" if r.server_plan is None else str(r.server_plan),
            str(r.bench_level if r.bench_level is not None else r.n_cpu_moe),
            _asked(r),
            str(r.level) if any(c.served and c.n_cpu_moe == r.level for c in r.checks) else f"{r.level} (none served)",
        )
        for r in placed
    ]
    return [
        Block("h3", "Tuned variants: placed by their own llama-server"),
        Block(
            "p",
            "The tuning trials run in llama-bench, which reserves a whole ubatch of logits (about 2.3 GiB at -ub "
            "4096 on a 150K vocabulary) that llama-server never allocates: llama-bench's level would give up experts, "
            "and decode with them, that the server has room for. Each tuned variant is therefore placed by real "
            "llama-server loads at its own settings and the configuration's context, under the same budget, each "
            "proven by one request that fills its ubatch: a bisection between the planner's least level for a "
            "server (one row of logits, no headroom) and llama-bench's level, which is asked first. The variant "
            "runs at the lowest level that served; the level below it was asked and did not.",
        ),
        table(
            (
                "variant",
                "context",
                "budget",
                "ubatch",
                "planner's level (server)",
                "llama-bench's level",
                "levels asked: what llama-server did",
                "server's level",
            ),
            rows,
        ),
    ]


def fit_blocks(data: StudyData) -> list[Block]:
    every = fit_placements(data)
    if not every:
        return []
    chosen = [r for r in every if not r.by_server]
    placed = [r for r in every if r.by_server]
    rows = []
    for r in chosen:
        by_level = {c.n_cpu_moe: c for c in r.checks}
        n, at = r.n_cpu_moe, r.level
        rows.append(
            (
                r.config,
                r.request,
                f"{r.n_ctx:,}",
                f"{r.budget_bytes / GIB:.1f} GiB",
                str(r.ubatch),
                str(n),
                f"{r.estimate.total_bytes / GIB:.2f} GiB + {r.headroom_bytes / GIB:.1f} GiB headroom",
                _compute(r, by_level.get(at)),
                _did(by_level.get(n)),
                _did(by_level.get(n - 1)),
                str(at) if at == n else f"{at} (llama.cpp refused {n})",
                _llama_fit(r),
            )
        )
    logged = any(c.compute_bytes is not None for r in chosen for c in r.checks)
    return [
        Block("h2", "Fit: the smallest --n-cpu-moe that holds the context"),
        Block(
            "p",
            "The placement planner's level for each 'fit' configuration (llama.cpp's buffer arithmetic: model, "
            "KV and compute buffers, plus headroom for the CUDA context and the first request's allocations), "
            "then llama.cpp itself at that level and one below: llama-server started with the same context "
            "under the same budget, answering one ubatch-long request. A tuned variant, and each trial of the "
            "tuning search, is placed again for its own ubatch and KV cache types (a larger ubatch needs a larger "
            "compute buffer, a q8_0 cache frees VRAM), "
            + (
                "with the compute buffer calibrated from the one llama.cpp logged at the checked level (the "
                "planner's own estimate is off both ways)"
                if logged
                else "with the planner's compute buffer (no check of this study logged one to calibrate it with)"
            )
            + ". The last column is what llama.cpp's own "
            "--fit (llama-fit-params, same context and budget) would do instead: it keeps every layer's attention "
            "on the GPU and moves the experts of the highest layers to the CPU, where --n-cpu-moe moves the "
            "lowest; the number of layers is what compares.",
        ),
        table(
            (
                "config",
                "asked",
                "context",
                "budget",
                "ubatch",
                "planner's level",
                "planner's GPU buffers",
                "compute buffer: planned / logged",
                "llama.cpp at that level",
                "one level below",
                "measured at",
                "llama.cpp's --fit",
            ),
            rows,
        ),
        *(_server_blocks(placed) if placed else []),
    ]
