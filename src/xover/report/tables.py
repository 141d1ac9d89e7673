"""Markdown tables of llama-bench results, one column per configuration. Pure: records in, text out.

The layout mirrors llama-bench's own markdown so numbers can be checked against it: rows are tests
(``pp512 @ d4000``, ``tg128 @ d4000``) in llama-bench's order, cells are ``avg ± sd`` t/s with
llama-bench's precision (``%.2f ± %.2f``), and the comparison between configurations reads across.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xover.domain.config import LlamaConfig, common_flags, short_labels  # noqa: F401 (re-exported)
from xover.domain.records import BenchResult, Failure

MISSING = "-"
FAILED = "failed"


# ---- cells and header -----------------------------------------------------------------------------


def cell(result: BenchResult) -> str:
    """llama-bench's own t/s cell: ``%.2f ± %.2f`` of its mean and sample standard deviation."""
    return f"{result.avg_ts:.2f} ± {result.stddev_ts:.2f}"


def _row_order(result: BenchResult) -> tuple[int, int, int, int]:
    return (result.n_depth, 1 if result.n_gen and not result.n_prompt else 0, result.n_prompt, result.n_gen)


def format_size(n_bytes: int) -> str:
    """Bytes as MiB below a GiB, else GiB, two decimals."""
    return f"{n_bytes / 2**20:.2f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def _distinct(records: Sequence[dict[str, Any]], *keys: str) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(tuple(r.get(k) for k in keys) for r in records))


def _header(results: Sequence[BenchResult], configs: Sequence[LlamaConfig], model_name: str | None) -> list[str]:
    records = [r.record for r in results]
    lines = []
    models = _distinct(records, "model_filename", "model_type", "model_size", "model_n_params")
    if models:
        parts = []
        for filename, mtype, size, n_params in models:
            desc = ", ".join(
                x
                for x in (
                    mtype,
                    format_size(int(size)) if size is not None else None,
                    f"{_params(int(n_params))} params" if n_params is not None else None,
                )
                if x
            )
            parts.append(f"{model_name or str(filename).rsplit('/', 1)[-1]} ({desc})")
        lines.append("model: " + "; ".join(parts))
    elif model_name:
        lines.append(f"model: {model_name}")
    builds = _distinct(records, "build_commit", "build_number", "backends")
    if builds:
        text = "; ".join(f"llama.cpp {c} ({n}), backend {b}" for c, n, b in builds)
        lines.append(
            ("build: " + text) + (" (results from different builds: compare with care)" if len(builds) > 1 else "")
        )
    machines = _distinct(records, "cpu_info", "gpu_info")
    if machines:
        lines.append("machine: " + "; ".join(f"{c}" + (f", {g}" if g else "") for c, g in machines))
    reps = sorted({len(r.samples_ns) for r in results})
    common = common_flags(configs)
    stat = "t/s as mean ± sample sd"
    if reps:
        stat += (
            f" over {reps[0]} repetition{'s' if reps[0] > 1 else ''}"
            if len(reps) == 1
            else f" over {reps[0]}-{reps[-1]} repetitions"
        )
    lines.append(f"common flags: {common}; {stat}" if common else stat)
    return [f"- {line}" for line in lines]


# ---- the table ------------------------------------------------------------------------------------


def render_bench_table(
    configs: Sequence[LlamaConfig],
    results: Sequence[BenchResult],
    failures: Sequence[Failure] = (),
    model_name: str | None = None,
) -> str:
    """One markdown table: a row per test, a column per configuration (in the given order).

    ``results`` come in storage order; when a test was measured more than once for a configuration,
    the last measurement is shown. ``failures`` are the ones still standing (the caller leaves out
    those a later run repaired); each is explained under the table, and a missing cell of its
    configuration reads ``failed`` (``-`` otherwise).
    """
    keys = [c.key for c in configs]
    latest: dict[tuple[str, tuple[int, int, int]], BenchResult] = {}
    for r in results:
        if r.config_key in keys:
            latest[(r.config_key, (r.n_prompt, r.n_gen, r.n_depth))] = r
    shown = list(latest.values())
    rows: dict[str, tuple[tuple[int, int, int, int], tuple[int, int, int]]] = {}
    for r in sorted(shown, key=_row_order):
        rows.setdefault(r.test_name, (_row_order(r), (r.n_prompt, r.n_gen, r.n_depth)))
    failed = {f.config_key: f for f in failures}
    labels = short_labels(configs)

    header = ["test", *labels]
    body = []
    for name, (_, point) in rows.items():
        line = [name]
        for key in keys:
            found = latest.get((key, point))
            line.append(cell(found) if found is not None else FAILED if key in failed else MISSING)
        body.append(line)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        return (
            "| " + " | ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))) + " |"
        )

    out = _header(shown, configs, model_name)
    if body:
        rule = ["-" * w if i == 0 else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
        out += ["", fmt(header), "| " + " | ".join(rule) + " |", *(fmt(row) for row in body)]
    else:
        out += ["", "(no results)"]
    notes = [f"- {label} failed: {failed[key].reason}" for key, label in zip(keys, labels) if key in failed]
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"
