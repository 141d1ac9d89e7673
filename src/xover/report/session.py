"""The agentic-session section of the report: per-turn TTFT and cumulative time per configuration and
cache mode, and which configuration wins the whole session. Renderers are pure (stored turns in,
text out); the series come from the read model (:mod:`xover.results.read_model`).
"""

from __future__ import annotations

import base64
import html
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

from xover.domain.records import SessionTurn
from xover.report.blocks import html_table, plain_md_table
from xover.report.plots import _plt, _png
from xover.results.read_model import SessionSeries, mode_rank

MODE_TEXT = {
    "default": "llama-server's default prompt cache",
    "reuse": "the prompt cache and --cache-reuse",
    "off": "caching off",
}
_LINESTYLE = {"default": "-", "reuse": "--", "off": ":"}
Cached = tuple[Mapping[str, Callable[[int], float]], int]  # configuration -> TTFT(new tokens) fit, and its depth


# ---- numbers (pure) -----------------------------------------------------------------------------


def _tokens(n: float) -> str:
    return f"{n:,.0f}"


def _s(ns: int) -> str:
    return f"{ns / 1e9:,.2f} s"


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.1f}"


def _median(values: Iterable[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def _prompt_n(t: SessionTurn) -> int | None:
    return t.timings.prompt_n if t.timings else None


def _cache_n(t: SessionTurn) -> int | None:
    return t.timings.cache_n if t.timings else None


def session_verdict(series: Sequence[SessionSeries], crossover_tokens: float | None = None) -> str | None:
    """Which configuration wins the whole session (lowest total time) with the cache on, how that
    compares with the cold-prefill crossover, and whether turning the cache off changes the answer."""
    complete = [s for s in series if s.total_ns is not None]
    if not complete:
        return None
    primary = min({s.mode for s in complete}, key=mode_rank)
    ranked = sorted((s for s in complete if s.mode == primary), key=lambda s: s.total_ns or 0)
    win = ranked[0]
    prompts = [t.prompt_tokens for t in win.turns if t.prompt_tokens is not None]
    n = len(win.turns)
    rewrites = sum(t.rewrite for t in win.turns)
    span = f"prompts {_tokens(prompts[0])} to {_tokens(max(prompts))} tokens, " if prompts else ""
    head = (
        f"Over the whole {n}-turn agentic session ({span}{rewrites} context rewrite{'s' if rewrites != 1 else ''}), "
        f"with {MODE_TEXT.get(primary, primary)}"
    )
    if len(ranked) > 1:
        second = ranked[1]
        text = [
            f"{head} {win.label} wins: {_s(win.total_ns or 0)} in total against {_s(second.total_ns or 0)} for "
            f"{second.label} ({_less(win, second):.0f}% less)."
        ]
    else:
        text = [f"{head} {win.label} takes {_s(win.total_ns or 0)} (the only configuration replayed in this mode)."]
    if crossover_tokens is not None:
        longer = sum(1 for p in prompts if p > crossover_tokens)
        if primary == "off":
            text.append(
                f"The cold-prefill crossover is {_tokens(crossover_tokens)} tokens and {longer} of {n} turns send "
                "longer prompts, all of them prefilled in full."
            )
        else:
            new = _median(_prompt_n(t) for t in win.turns[1:]) or 0.0
            text.append(
                f"The cold-prefill crossover is {_tokens(crossover_tokens)} tokens and {longer} of {n} turns send "
                f"longer prompts, but with the cache a turn prefills a median of {_tokens(new)} new tokens, "
                f"{'below' if new < crossover_tokens else 'above'} the crossover."
            )
    off = sorted((s for s in complete if s.mode == "off"), key=lambda s: s.total_ns or 0)
    own_off = [s for s in off if s.label == win.label]
    if primary != "off" and own_off:
        text.append(f"Against caching off the cache saves {_less(win, own_off[0]):.0f}% of {win.label}'s session time.")
    if primary != "off" and len(off) > 1:
        same = off[0].label == win.label
        text.append(
            f"With caching off (every turn a cold prefill) {off[0].label} wins ({_s(off[0].total_ns or 0)})"
            + (", the same configuration." if same else f", not {win.label}: the cache changes the answer.")
        )
    return " ".join(text)


def _less(a: SessionSeries, b: SessionSeries) -> float:
    """How much shorter session ``a`` is than ``b``, in percent of ``b``."""
    return 100 * (1 - (a.total_ns or 0) / (b.total_ns or 1))


def session_table(series: Sequence[SessionSeries]) -> tuple[list[str], list[list[str]]]:
    header = [
        "config",
        "cache mode",
        "turns",
        "session time",
        "TTFT median ms",
        "TTFT max ms",
        "prefilled tokens (sum prompt_n)",
        "from cache (sum cache_n)",
        "decode tok/s (median, server)",
    ]
    rows = []
    for s in series:
        ok = [t for t in s.turns if t.error is None]
        ttfts = [t.first_token_ns for t in ok if t.first_token_ns is not None]
        decode = _median(t.timings.predicted_per_second if t.timings else None for t in ok)
        med = _median(ttfts)
        rows.append(
            [
                s.label,
                s.mode,
                str(len(s.turns)) if s.complete else f"{len(ok)} of {len(s.turns)} ok (incomplete)",
                _s(s.total_ns) if s.total_ns is not None else "-",
                _ms(round(med) if med is not None else None),
                _ms(max(ttfts) if ttfts else None),
                _tokens(sum(_prompt_n(t) or 0 for t in ok)),
                _tokens(sum(_cache_n(t) or 0 for t in ok)),
                f"{decode:,.1f}" if decode is not None else "-",
            ]
        )
    return header, rows


def turn_table(series: Sequence[SessionSeries]) -> tuple[list[str], list[list[str]]]:
    """One row per turn; per series its TTFT and cache_n / prompt_n."""
    if not series:
        return [], []
    ref = max(series, key=lambda s: len(s.turns))
    header = ["turn", "prompt tokens", "unchanged prefix", "rewrite"] + [
        f"{s.label} {s.mode}: TTFT ms (cache_n/prompt_n)" for s in series
    ]
    rows = []
    for i, t in enumerate(ref.turns):
        row = [
            str(i),
            _tokens(t.prompt_tokens) if t.prompt_tokens is not None else "-",
            _tokens(t.prefix_tokens) if t.prefix_tokens is not None else "-",
            "yes" if t.rewrite else "",
        ]
        for s in series:
            u = s.turns[i] if i < len(s.turns) else None
            if u is None or u.error is not None:
                row.append("error" if u is not None else "-")
            else:
                row.append(f"{_ms(u.first_token_ns)} ({_cache_n(u)}/{_prompt_n(u)})")
        rows.append(row)
    return header, rows


def against_cached(
    series: Sequence[SessionSeries], ttft_of: Mapping[str, Callable[[int], float]], depth: int
) -> tuple[list[str], list[list[str]], list[str]]:
    """Each replayed turn that came from the cache (cache_n > 0) beside what the study's cached agentic turns predict
    for its new tokens (``ttft_of``: configuration -> TTFT in seconds of a turn of N new tokens, fitted to the
    cached turns measured on a ``depth``-token context); the table and one summary line per configuration (the
    median of measured over predicted). A session turn sits on its own context, deeper or shallower than
    ``depth``: prefill slows with depth, so a ratio above 1 on deeper turns is expected."""
    header = ["config", "mode", "turn", "cache_n", "prompt_n (new)", "TTFT ms", "predicted ms", "measured / predicted"]
    rows: list[list[str]] = []
    ratios: dict[str, list[float]] = {}
    for s in series:
        fit = ttft_of.get(s.label)
        if fit is None or s.mode == "off":
            continue
        for t in s.turns:
            cached, new = _cache_n(t), _prompt_n(t)
            if t.error is not None or t.first_token_ns is None or not cached or not new:
                continue
            predicted = fit(new)
            if predicted <= 0:
                continue
            ratio = t.first_token_ns / 1e9 / predicted
            ratios.setdefault(f"{s.label} ({s.mode})", []).append(ratio)
            rows.append(
                [
                    s.label,
                    s.mode,
                    str(t.turn),
                    _tokens(cached),
                    _tokens(new),
                    _ms(t.first_token_ns),
                    f"{predicted * 1000:,.1f}",
                    f"{ratio:.2f}",
                ]
            )
    summary = [
        f"{name}: the replayed turns took {statistics.median(r):.2f}x what its cached turns on a {depth:,}-token "
        f"context predict for their new tokens (median of {len(r)} turns, {min(r):.2f}-{max(r):.2f})"
        for name, r in ratios.items()
    ]
    return header, rows, summary


AGAINST = (
    "Against the cached turns: each replayed turn served from the cache beside the TTFT the study's cached agentic "
    "turns predict for its new tokens (their fit, on their own cached context; a deeper turn prefills slower)."
)


def _description(series: Sequence[SessionSeries]) -> str:
    s = series[0]
    rewrites = [str(t.turn) for t in s.turns if t.rewrite]
    response = next((t.completion_tokens for t in s.turns if t.completion_tokens), None)
    fed = (
        "the server's own replies fed back into the conversation, as a client would"
        if s.feed == "generated"
        else "the recorded replies fed back, whatever the server generated"
    )
    return (
        f"Workload {s.session_id}: {len(s.turns)} turns, {response or '?'} response tokens per turn, {fed}; "
        f"context rewritten in place at turn{'s' if len(rewrites) != 1 else ''} {', '.join(rewrites) or 'none'}. "
        "Each configuration and cache mode ran on a freshly started llama-server. Cache modes: default (cache_prompt, "
        "several slots, host-memory prompt cache), reuse (the same plus --cache-reuse), off (cache_prompt false, "
        "-np 1 --cache-ram 0: every turn a cold prefill). Session time is the sum of the turn times."
    )


# ---- plots and renderers ------------------------------------------------------------------------


def session_plot(series: Sequence[SessionSeries]) -> bytes:
    """TTFT per turn and cumulative session time, one colour per configuration, one line style per mode."""

    plt = _plt()
    fig, (ax_ttft, ax_cum) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for s in series:
        color = colors.setdefault(s.label, palette[len(colors) % len(palette)])
        style = _LINESTYLE.get(s.mode, "-.")
        pts = [(t.turn, t.first_token_ns / 1e9) for t in s.turns if t.first_token_ns is not None and t.error is None]
        ax_ttft.plot(
            [p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, color=color, label=f"{s.label} {s.mode}"
        )
        cum = s.cumulative_s()
        ax_cum.plot(range(len(cum)), cum, style, marker="o", ms=3, color=color, label=f"{s.label} {s.mode}")
    from matplotlib.ticker import MaxNLocator  # local: 0.5 s of import, only where a plot is drawn

    rewrites = sorted({t.turn for s in series for t in s.turns if t.rewrite})
    for ax in (ax_ttft, ax_cum):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        for r in rewrites:
            ax.axvline(r, color="gray", lw=0.8, alpha=0.5)
        ax.set_xlabel("turn" + (" (gray lines: context rewritten)" if rewrites else ""))
        ax.grid(True, alpha=0.3)
    ax_ttft.set_ylabel("time to first token (s)")
    ax_ttft.set_title("TTFT per turn")
    ax_cum.set_ylabel("cumulative session time (s)")
    ax_cum.set_title("Cumulative time over the session")
    ax_cum.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def session_section_html(
    series: Sequence[SessionSeries], *, crossover_tokens: float | None = None, cached: Cached | None = None
) -> str:
    """The report section as an HTML fragment (plots embedded as base64 PNG, every text escaped)."""
    parts = ["<h2>Agentic session replay</h2>"]
    if not series:
        return parts[0] + "<p class='muted'>No session replayed: run <code>xover session</code>.</p>"
    verdict = session_verdict(series, crossover_tokens)
    parts.append(
        f"<p class='verdict'>{_e(verdict)}</p>"
        if verdict
        else "<p class='muted'>No replay completed every turn: no session time to compare.</p>"
    )
    parts.append(f"<p>{_e(_description(series))}</p>")
    b64 = base64.b64encode(session_plot(series)).decode()
    caption = "Agentic session: TTFT per turn and cumulative time"
    parts.append(f"<img id='plot-session' alt='{_e(caption)}' src='data:image/png;base64,{b64}'>")
    parts.append(f"<h3>Whole session</h3>{html_table(*session_table(series))}")
    parts.append(f"<h3>Per turn</h3>{html_table(*turn_table(series))}")
    if cached is not None:
        header, rows, summary = against_cached(series, *cached)
        if rows:
            parts.append(f"<h3>Against the cached turns</h3><p>{_e(AGAINST)}</p>")
            parts.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in summary) + "</ul>")
            parts.append(html_table(header, rows))
    return "\n".join(parts)


def session_section_markdown(
    series: Sequence[SessionSeries], *, crossover_tokens: float | None = None, cached: Cached | None = None
) -> str:
    out = ["## Agentic session replay\n"]
    if not series:
        return out[0] + "\n_no session replayed_\n"
    verdict = session_verdict(series, crossover_tokens)
    out += [
        f"**{verdict}**\n" if verdict else "_no replay completed every turn_\n",
        _description(series) + "\n",
        "### Whole session\n",
        plain_md_table(*session_table(series)),
        "### Per turn\n",
        plain_md_table(*turn_table(series)),
    ]
    if cached is not None:
        header, rows, summary = against_cached(series, *cached)
        if rows:
            out += ["### Against the cached turns\n", AGAINST + "\n", "".join(f"- {x}\n" for x in summary)]
            out.append(plain_md_table(header, rows))
    return "\n".join(out)
