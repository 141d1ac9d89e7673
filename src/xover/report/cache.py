"""The prompt-cache lab's report section: the before/after table, the findings and one plot.

Pure renderers over :class:`xover.results.read_model.StudyData`: the lab's samples (modes
``cache:<case>:<request>``) are analysed by :func:`xover.measure.cachelab.analyse`; both functions return
an empty string when the study holds no lab samples, so the section can be left out. All text is
escaped; the plot is embedded as a base64 PNG.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

from xover.analysis.cachelab import (
    INSERTED,
    OTHERS,
    REUSE_MIN,
    SHORT,
    STATE_ARTIFACT,
    LabAnalysis,
    LabRow,
    analyse,
    lab_samples,
)
from xover.domain.shapes import Hyperparams, kv_bytes_per_token
from xover.report.blocks import md_cell
from xover.report.plots import _plt, _png
from xover.results.read_model import StudyData

TITLE = "Prompt cache lab"

HEADER = [
    "scenario",
    "request",
    "L",
    "TTFT ms",
    "prompt_n",
    "cache_n",
    "server prompt_ms",
    "client-server gap ms",
    "verdict",
]

INTRO = (
    "Each scenario ran on a freshly started llama-server; every request sent cache_prompt: true. "
    "resend: one prompt twice (-np 1 --cache-ram 0). "
    f"edit (--cache-reuse {REUSE_MIN}): an original prompt, then an edited one: {INSERTED} tokens inserted mid-prompt "
    "(edit-insert), or a chunk dropped from the middle and new tokens appended, with n_cache_reuse 0 in the request "
    f"(edit-move-noreuse), with the server's reuse (edit-move), and with the kept chunk shorter than the threshold "
    f"({SHORT} tokens, edit-move-short). "
    f"hidden: prompt A, {OTHERS} other prompts, every slot erased, A again, on default settings and on "
    "-np 1 --cache-ram 0. The client-server gap is client TTFT minus the server's prompt_ms."
)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _n(value: int | None) -> str:
    return "—" if value is None else str(value)


def lab_table(analysis: LabAnalysis) -> tuple[list[str], list[list[str]]]:
    """The table: one row per request; a leading config column when several configurations ran the lab."""
    several = len({r.label for r in analysis.rows}) > 1
    header = (["config"] if several else []) + HEADER
    rows = []
    for r in analysis.rows:
        cells = [
            r.case,
            r.request,
            f"{r.length:,}",
            _ms(r.ttft_ns / 1e6 if r.ttft_ns is not None else None),
            _n(r.prompt_n),
            _n(r.cache_n),
            _ms(r.prompt_ms),
            _ms(r.gap_ns / 1e6 if r.gap_ns is not None else None),
            r.verdict,
        ]
        rows.append(([r.label] if several else []) + cells)
    return header, rows


def cache_plot(rows: Sequence[LabRow]) -> bytes | None:
    """TTFT of every lab request (log scale), each bar coloured by the share of its prompt served
    from cache and labelled cache_n/prompt_n. None when no request has a TTFT."""
    shown = [r for r in rows if r.ttft_ns is not None]
    if not shown:
        return None
    from matplotlib.ticker import FuncFormatter  # local: 0.5 s of import, only where a plot is drawn

    plt = _plt()
    several = len({r.label for r in shown}) > 1
    cmap = plt.get_cmap("RdYlGn")
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(shown) + 1.4))
    ys = list(range(len(shown)))
    shares = [r.cache_n / (r.cache_n + r.prompt_n) if r.cache_n is not None and r.prompt_n else 0.0 for r in shown]
    ax.barh(ys, [r.ttft_ns / 1e6 for r in shown], color=[cmap(s) for s in shares])  # type: ignore[operator]
    for y, r in zip(ys, shown):
        ax.annotate(
            f"{_n(r.cache_n)}/{_n(r.prompt_n)}",
            (r.ttft_ns / 1e6, y),  # type: ignore[operator]
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.set_yticks(ys)
    ax.set_yticklabels([(f"{r.label}: " if several else "") + f"{r.case} / {r.request}" for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(right=max(r.ttft_ns or 0 for r in shown) / 1e6 * 2.5)  # room for the labels
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("time to first token (ms, log scale); bars labelled cache_n/prompt_n")
    ax.set_title("Prompt cache lab: TTFT per request, coloured by the share served from cache")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    fig.colorbar(sm, ax=ax, pad=0.02).set_label("cache_n / (cache_n + prompt_n)", fontsize=8)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    return _png(fig)


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table id='cache-lab'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def lab_state_bytes(data: StudyData) -> dict[str, int]:
    """Per lab label, the prompt state's bytes per token the lab's predictions use: what the lab stored
    (:data:`STATE_ARTIFACT`), else, for a study of one model whose header is stored (artifact ``inspect``),
    its F16 KV cache per token."""
    out: dict[str, int] = {}
    inspects = data.artifact_bodies("inspect")
    if len(inspects) == 1 and isinstance(inspects[0].get("hparams"), dict):
        try:
            bpt = kv_bytes_per_token(Hyperparams(**inspects[0]["hparams"]))
        except TypeError:
            bpt = None
        if bpt is not None:
            out = {label: bpt for label, _ in lab_samples(data.ttft)}
    for body in data.artifact_bodies(STATE_ARTIFACT):
        if isinstance(body.get("state_bytes_per_token"), int):
            out[str(body.get("label"))] = body["state_bytes_per_token"]
    return out


def cache_section_html(data: StudyData) -> str:
    """``<h2>`` section: findings, the table and the plot; empty when the study holds no lab samples."""
    analysis = analyse(lab_samples(data.ttft), lab_state_bytes(data))
    if not analysis.rows:
        return ""
    parts = [f"<h2 id='cache-lab-title'>{_e(TITLE)}</h2>", f"<p>{_e(INTRO)}</p>"]
    parts += [f"<p class='verdict'>{_e(h)}</p>" for h in analysis.headlines]
    parts.append(_html_table(*lab_table(analysis)))
    png = cache_plot(analysis.rows)
    if png is not None:
        alt = "Prompt cache lab: TTFT per request"
        parts.append(
            f"<img id='plot-cache-lab' alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    return "\n".join(parts)


def cache_section_markdown(data: StudyData) -> str:
    """``##`` section: findings and the table; empty when the study holds no lab samples."""
    analysis = analyse(lab_samples(data.ttft), lab_state_bytes(data))
    if not analysis.rows:
        return ""
    header, rows = lab_table(analysis)
    out = [f"## {TITLE}\n", INTRO, ""]
    out += [f"- {md_cell(h)}" for h in analysis.headlines]
    out += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"
