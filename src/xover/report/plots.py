"""Plots as PNG bytes. Renderers only: they take analysed data and return bytes, never write files.

matplotlib is imported here and nowhere else, lazily, with the non-interactive Agg backend.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xover.analysis.crossover import (
    ConfigData,
    PairResult,
    claimed_crossing,
    fit_cost_model,
    measured_totals,
    round_totals,
)
from xover.analysis.stats import summarize
from xover.domain.records import BenchResult
from xover.domain.units import format_tokens

AGENTIC_COLOR = "#f2c14e"


def _plt() -> Any:
    import matplotlib  # local: 0.5 s of import, only where a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # local: 0.5 s of import, only where a plot is drawn

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _k_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter  # local: 0.5 s of import, only where a plot is drawn

    return FuncFormatter(lambda x, _: format_tokens(x) if x == int(x) else f"{x:g}")


def _plain_log_y(ax: Any) -> None:
    """Plain numbers on a log y axis; the minor ticks (2, 3, ... 9 times a power of ten) are labelled too when the
    axis spans less than a decade, which would otherwise show no number at all, and those at 2 and 5 within two
    decades. Call it after plotting."""
    from matplotlib.ticker import FuncFormatter  # local: 0.5 s of import, only where a plot is drawn

    lo, hi = ax.get_ylim()
    span = hi / lo if lo > 0 else float("inf")
    # the leading digit of each minor tick that gets a number: all within a decade, 2 and 5 within two
    shown = set(range(2, 10)) if span < 10 else {2, 5} if span < 100 else set()

    def minor(y: float, _: object) -> str:
        return f"{y:g}" if y > 0 and int(round(y / 10 ** math.floor(math.log10(y)))) in shown else ""

    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(minor))


@dataclasses.dataclass(frozen=True)
class CrossingMark:
    """A crossover line on the total-time plot: the one the pair's verdict claims."""

    text: str
    length: float
    fitted: bool
    extrapolated: bool


def crossing_marks(pairs: Sequence[PairResult]) -> list[CrossingMark]:
    """The crossovers to draw: for each pair given (the report passes its headline pairs), the one its
    verdict claims (:func:`~xover.analysis.crossover.claimed_crossing`), nothing for a pair within noise."""
    out = []
    for p in pairs:
        claim = claimed_crossing(p)
        if claim is None:
            continue
        prefix = "fitted " if claim.fitted else ""
        suffix = " (extrapolated)" if claim.extrapolated else ""
        out.append(
            CrossingMark(
                f"{prefix}{p.a} = {p.b}\n@ {format_tokens(claim.length)}{suffix}",
                claim.length,
                claim.fitted,
                claim.extrapolated,
            )
        )
    return out


def round_ranges(config: ConfigData, response: int) -> dict[int, tuple[float, float]]:
    """Prompt length -> (lowest, highest) total time per turn over the rounds of fresh processes that measured it,
    where at least two did: the spread a verdict between configurations is weighed against."""
    out = {}
    for length in sorted(config.ttft_s):
        totals = list(round_totals(config, length, response).values())
        if len(totals) >= 2:
            out[length] = (min(totals), max(totals))
    return out


def total_time_plot(
    configs: Sequence[ConfigData],
    pairs: Sequence[PairResult],
    response: int,
    band: tuple[int, int],
    base_of: Mapping[str, str] | None = None,
) -> bytes:
    """Total time per turn vs prompt length, one colour per configuration (measured medians as markers, with the
    range of the rounds of fresh processes as whiskers where there were rounds, the fitted cost model as a line),
    the crossovers the verdicts claim for ``pairs`` marked (:func:`crossing_marks`), the agentic band shaded.
    ``base_of``: tuned variant -> its base configuration; a variant shares its base's colour, with square markers
    and a dashed line."""
    plt = _plt()

    base_of = base_of or {}
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.axvspan(
        band[0], band[1], color=AGENTIC_COLOR, alpha=0.25, label=f"agentic turns ({band[0] // 1000}-{band[1] // 1000}K)"
    )
    all_lengths = sorted({L for c in configs for L in c.ttft_s})
    lo, hi = all_lengths[0], all_lengths[-1]
    xs = np.geomspace(max(lo / 1.5, 1), hi * 1.5, 200)
    colors: dict[str, str] = {}
    spreads = {c.label: round_ranges(c, response) for c in configs}
    cycle = iter(plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"]) * 4)
    for c in configs:
        base = base_of.get(c.label)
        color = colors.get(base) if base is not None else None
        if color is None:
            color = next(cycle)
        colors[c.label] = color
        totals = measured_totals(c, response)
        model = fit_cost_model(c)
        tuned = base is not None
        ax.plot(xs, [model.total(x, response) for x in xs], "--" if tuned else "-", color=color, alpha=0.6)
        marker = "s" if tuned else "o"
        ax.plot(list(totals), list(totals.values()), marker, color=color, ls="none")
        spread = spreads[c.label]
        if spread:  # whiskers: the rounds' range around their median
            at = [L for L in spread if L in totals]
            low = [totals[L] - spread[L][0] for L in at]
            high = [spread[L][1] - totals[L] for L in at]
            ax.errorbar(at, [totals[L] for L in at], yerr=[low, high], fmt="none", ecolor=color, capsize=3, alpha=0.8)
        ax.plot([], [], marker=marker, ls="--" if tuned else "-", color=color, label=c.label)  # legend: both
    for m in crossing_marks(pairs):
        color = "gray" if m.fitted else "black"
        ax.axvline(m.length, color=color, ls=":" if m.fitted else "--", lw=1)
        ax.annotate(
            m.text, (m.length, ax.get_ylim()[1]), xytext=(4, -28), textcoords="offset points", fontsize=8, color=color
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_y(ax)
    ax.xaxis.set_major_formatter(_k_formatter())
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel(f"total time per turn (s): TTFT + {response} tokens decode")
    measured = "markers measured, whiskers the rounds' range" if any(spreads.values()) else "markers measured"
    ax.set_title(f"Total time per turn vs prompt length ({measured}, lines fitted)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _png(fig)


def ttft_plot(configs: Sequence[ConfigData]) -> bytes:
    """Cold TTFT vs prompt length (median with min-max whiskers), log-log."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for c in configs:
        lengths = sorted(c.ttft_s)
        sums = [summarize(c.ttft_s[L]) for L in lengths]
        med = [s.median for s in sums]
        yerr = [[m - s.minimum for m, s in zip(med, sums)], [s.maximum - m for m, s in zip(med, sums)]]
        ax.errorbar(lengths, med, yerr=yerr, marker="o", capsize=3, label=c.label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_y(ax)
    ax.xaxis.set_major_formatter(_k_formatter())
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("time to first token (s, log scale)")
    ax.set_title("Cold TTFT (median, whiskers min-max)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _png(fig)


def depth_plot(bench: Sequence[tuple[str, BenchResult]]) -> bytes | None:
    """llama-bench prefill (pp) and decode (tg) tok/s vs depth, mean ± sd, one line per config."""
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    for label, r in bench:
        kind = "pp" if r.n_prompt and not r.n_gen else "tg" if r.n_gen and not r.n_prompt else None
        if kind:
            series[(kind, label)].append((r.n_depth, r.avg_ts, r.stddev_ts))
    if not series:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind, title in ((axes[0], "pp", "prefill (pp) t/s"), (axes[1], "tg", "decode (tg) t/s")):
        for (k, label), pts in series.items():
            if k != kind:
                continue
            pts.sort()
            ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label
            )
        ax.set_xscale("symlog", linthresh=256)
        ax.xaxis.set_major_formatter(_k_formatter())
        ax.set_xlabel("context depth before the test (tokens)")
        ax.set_ylabel(f"{title} (tokens/s)")
        ax.set_title(f"llama-bench {title} vs depth")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", color="gray")
    fig.tight_layout()
    return _png(fig)


def turns_plot(turns: Sequence[tuple[int, int, int]]) -> bytes:
    """A recording's turns: new tokens per turn against the cached prefix they were added to (each a dot, sized by
    its answer), with the new tokens' and the answers' distributions beside."""
    plt = _plt()
    fig, (ax, ax_new, ax_ans) = plt.subplots(1, 3, figsize=(12, 3.8), gridspec_kw={"width_ratios": [2, 1, 1]})
    new = [max(p - c, 1) for p, c, _ in turns]
    depth = [c for _, c, _ in turns]
    answers = [a for _, _, a in turns]
    top = max(answers) or 1
    ax.scatter(depth, new, s=[12 + 60 * a / top for a in answers], alpha=0.6)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(_k_formatter())
    ax.yaxis.set_major_formatter(_k_formatter())
    ax.set_xlabel("cached prefix (tokens)")
    ax.set_ylabel("new tokens in the turn (log)")
    ax.set_title(f"Your {len(turns)} recorded turns (dot size: answer length)")
    ax.grid(True, which="both", alpha=0.3)
    bins = np.logspace(0, math.log10(max(new) * 1.5), 20)
    ax_new.hist(new, bins=bins)
    ax_new.set_xscale("log")
    ax_new.xaxis.set_major_formatter(_k_formatter())
    ax_new.set_xlabel("new tokens per turn (log)")
    ax_new.set_ylabel("turns")
    ax_ans.hist(answers, bins=20)
    ax_ans.set_xlabel("answer tokens")
    fig.tight_layout()
    return _png(fig)
