"""The study report: a self-contained HTML page (plots embedded) and a markdown summary.

Pure renderers: ``build_report(data) -> Report`` analyses, ``render_html``/``render_markdown``
return strings. Every piece of text that came from outside (model names, flags, server output)
is escaped. :func:`write_report` is the one place that writes files.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from xover.analysis import pairs as told_rule
from xover.analysis.advise import ARTIFACT, advice_from_dict
from xover.analysis.crossover import (
    ConfigData,
    PairResult,
    claimed_crossing,
    compare_pair,
    fastest,
    fit_cost_model,
    measured_totals,
    relation,
    separation,
    swapped,
    too_few_rounds,
    verdict,
)
from xover.analysis.pairs import headline
from xover.analysis.rounds import MIN_ROUNDS
from xover.analysis.stats import summarize
from xover.analysis.theory import predicted_value
from xover.domain.artifacts import FOR_CACHED_SUFFIX
from xover.domain.llama_options import build_name
from xover.domain.records import TTFT_MODES, Provenance, TtftSample, backend_name
from xover.domain.turn_kinds import AFTER_COLD
from xover.domain.units import format_tokens
from xover.report import advise, cache, plots, session, your_turns
from xover.report.blocks import html_table, plain_md_table
from xover.report.cached import cached_blocks, cached_ttft, cached_verdicts, turns_workload
from xover.report.chat import chat_blocks, shape_line
from xover.report.command import command_blocks
from xover.report.decode import decode_blocks
from xover.report.fa import fa_findings, fa_table, fa_tests
from xover.report.fit import fit_blocks
from xover.report.rounds import drift_line, evidence_line, open_lines, rounds_blocks
from xover.report.rpclink import rpc_link_blocks
from xover.report.translate import translation_blocks
from xover.report.tune import Block, Layout, Measured, blocks, layout, section_html, section_markdown
from xover.results.read_model import StudyData, crossover_inputs, vram_budgets

if TYPE_CHECKING:
    from xover.analysis.advise import Advice

AGENTIC_BAND = (10_000, 40_000)


@dataclasses.dataclass(frozen=True)
class Matrix:
    """Every pair of configurations: ``cells[i][j]`` reads ``labels[i]`` against ``labels[j]``
    (:func:`~xover.analysis.crossover.relation`); the diagonal is empty."""

    labels: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]


@dataclasses.dataclass(frozen=True)
class Report:
    data: StudyData
    response: int
    band: tuple[int, int]
    configs: tuple[ConfigData, ...]
    pairs: tuple[PairResult, ...]  # every pair of configurations
    verdicts: tuple[str, ...]
    images: tuple[tuple[str, str, bytes], ...]  # (id, caption, png)
    headline: tuple[PairResult, ...] = ()  # the pairs the verdicts name (with their bootstrap)
    matrix: Matrix | None = None  # every pair, for the collapsed section
    layout: Layout | None = None
    incomparable: tuple[tuple[str, str, str], ...] = ()  # (a, b, why): pairs that share no measured length


def _ordered(configs: Sequence[ConfigData], lay: Layout) -> tuple[ConfigData, ...]:
    """Base configurations in spec order, each followed by its tuned variant; anything else after."""
    order = [x for b in lay.bases for x in lay.family(b)]
    rank = {label: i for i, label in enumerate(dict.fromkeys(order))}
    return tuple(sorted(configs, key=lambda c: rank.get(c.label, len(rank))))


def headline_pairs(lay: Layout, available: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The study's stored pairs (both sides measured), else the first two base configurations measured:
    the seed's question (:func:`xover.analysis.pairs.headline`)."""
    have = set(available)
    stored = tuple(p for p in lay.pairs if p[0] in have and p[1] in have and p[0] != p[1])
    return headline(stored, [b for b in lay.bases if b in have])


NOT_COMPARABLE = "cannot be compared"


def pair_matrix(configs: Sequence[ConfigData], pairs: Mapping[tuple[str, str], PairResult]) -> Matrix:
    """The matrix of ``pairs``; a pair not among them (two configurations that share no measured length) reads
    :data:`NOT_COMPARABLE`."""
    labels = tuple(c.label for c in configs)
    cells = []
    for a in labels:
        row = []
        for b in labels:
            if a == b:
                row.append("—")
            elif (a, b) in pairs:
                row.append(relation(pairs[(a, b)]))
            elif (b, a) in pairs:
                row.append(relation(swapped(pairs[(b, a)])))
            else:
                row.append(NOT_COMPARABLE)
        cells.append(tuple(row))
    return Matrix(labels, tuple(cells))


def _times(x: float) -> str:
    return f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def penalty_line(
    ref: str,
    other: str,
    best: Mapping[str, str],
    by_label: Mapping[str, ConfigData],
    response: int,
    band: tuple[int, int],
    why: Callable[[str], str] = lambda c: f"{c} keeps llama.cpp's defaults",
) -> str | None:
    """How much of ``other``'s cost against ``ref`` tuning removes: the ratio of median totals per turn at
    the agentic band's measured lengths (else the longest measured), at the defaults and each at its best.
    None when tuning changed neither."""
    bo, br = best.get(other, other), best.get(ref, ref)
    if bo == other and br == ref:
        return None
    four = [by_label[x] for x in dict.fromkeys((ref, other, br, bo))]
    totals = {c.label: measured_totals(c, response) for c in four}
    common = sorted(set.intersection(*(set(t) for t in totals.values())))
    if not common:
        return None
    lengths = [L for L in common if band[0] <= L <= band[1]] or [common[-1]]
    if bo != other and br != ref:
        when = "when both are tuned"
    else:
        when = f"with each at its best ({why(ref if br == ref else other)})"

    def cost(a: str, b: str, L: int) -> str:
        x, y = by_label[a], by_label[b]
        noise = (
            ""
            if separation(x, y, L, response) != 0
            else " (not yet compared)"
            if too_few_rounds(x, y, L, response)
            else " (within noise)"
        )
        return _times(totals[a][L] / totals[b][L]) + noise

    parts = [
        f"at {format_tokens(L)} {cost(other, ref, L)} at llama.cpp's defaults and {cost(bo, br, L)} {when}"
        for L in lengths
    ]
    return (
        f"Tuning and the offload penalty ({response}-token responses): a turn on {other} takes, against {ref}, "
        + "; ".join(parts)
        + "."
    )


_AT_DEFAULTS = "At llama.cpp's defaults: "
_AT_BEST = "Each configuration at its best: "
_TUNED = "Tuned against llama.cpp's defaults: "
_FOR_DECODE = "Which to run for which kind of turn (tuned for the whole turn, or for decode): "
_FOR_CACHED = "Which to run for which kind of turn (tuned for cold prompts, or for cached turns): "


_PREFIX = {
    told_rule.ONLY: "",
    told_rule.AT_DEFAULTS: _AT_DEFAULTS,
    told_rule.AT_BEST: _AT_BEST,
    told_rule.TUNED: _TUNED,
    told_rule.FOR_DECODE: _FOR_DECODE,
    told_rule.FOR_CACHED: _FOR_CACHED,
}


def _verdict_pairs(lay: Layout, by_label: Mapping[str, ConfigData]) -> list[tuple[str, str, str]]:
    """(prefix, a, b) for each verdict about a pair, in the order they are told (:func:`xover.analysis.pairs.
    told_pairs`, the rule the study's extra rounds follow), among the configurations measured."""
    best = {b: v for b, v in lay.tuned.items() if v in by_label}
    other = {b: d for b, d in lay.for_decode.items() if d in by_label and best.get(b, b) in by_label}
    told = told_rule.told_pairs(
        headline_pairs(lay, list(by_label)),
        [b for b in lay.bases if b in by_label],
        best,
        other,
        bool(best or lay.records),
        lambda d: d.endswith(FOR_CACHED_SUFFIX),
    )
    return [(_PREFIX[kind], a, b) for kind, a, b in told]


APART_S = 3600.0
"""Two configurations whose cold samples are further apart than this in time were measured apart (a study resumed
in another session, say): :func:`apart_note` says so."""


def apart_note(data: StudyData, a: str, b: str) -> str | None:
    """A caution when the cold samples of two configurations lie more than :data:`APART_S` apart in time: their
    comparison then includes whatever the machine did in between. None when they were measured together."""
    sent: dict[str, list[int]] = {a: [], b: []}
    runs: dict[str, set[int]] = {a: set(), b: set()}
    for row in data.cold_rows():
        if row.label in sent:
            sent[row.label].append(row.sample.sent_at_unix_ns)
            runs[row.label].add(row.run_id)
    if not sent[a] or not sent[b]:
        return None
    (a0, a1), (b0, b1) = ((min(sent[x]), max(sent[x])) for x in (a, b))
    gap_s = max(b0 - a1, a0 - b1) / 1e9
    if gap_s <= APART_S:
        return None

    def span(label: str) -> str:
        t0, t1 = (time.strftime("%Y-%m-%dT%H:%M", time.gmtime(t / 1e9)) for t in (min(sent[label]), max(sent[label])))
        ids = ", ".join(str(i) for i in sorted(runs[label]))
        return f"{t0}-{t1[-5:]} UTC (run{'s' if len(runs[label]) > 1 else ''} {ids})"

    return (
        f"Measured {gap_s / 3600:.1f} h apart: {a}'s cold samples at {span(a)}, {b}'s at {span(b)}. Their difference "
        "includes any drift of the machine in between (its decode speed above all): compare them with care, or "
        "measure both again together."
    )


def engines_line(data: StudyData, by_label: Mapping[str, ConfigData]) -> str | None:
    """Which build each configuration ran on, when the study compares builds (one build: None): its engine, or
    engine and backend where a configuration names its backend."""
    build_of = {c.label: build_name(*c.build) for c in data.configs if c.label in by_label}
    if len(set(build_of.values())) < 2:
        return None
    by_build: dict[str, list[str]] = {}
    for label, build in build_of.items():
        by_build.setdefault(build, []).append(label)
    backends = any(c.backend is not None for c in data.configs if c.label in by_label)
    title = "Builds" if backends else "Engines"
    return f"{title}: " + "; ".join(f"{e}: {', '.join(labels)}" for e, labels in by_build.items()) + "."


def build_report(
    data: StudyData, response: int = 200, band: tuple[int, int] = AGENTIC_BAND, n_boot: int = 500
) -> Report:
    """Analyses for the renderers. Verdicts, in order: the fastest configuration per length (tuned and
    untuned together); the headline pairs (the study's, else its first two configurations), answered at
    llama.cpp's defaults and with each configuration at its best when tuned variants exist; how much of
    the offload penalty tuning removes. Every other pair goes to the matrix, not to a verdict."""
    lay = layout(data)
    configs = _ordered(crossover_inputs(data), lay)
    by_label = {c.label: c for c in configs}
    apart: dict[tuple[str, str], str] = {}  # pairs that cannot be compared, and why

    def compared(a: str, b: str, boot: int) -> PairResult | None:
        try:
            return compare_pair(by_label[a], by_label[b], response, n_boot=boot)
        except ValueError as exc:  # no prompt length measured on both
            apart[(a, b)] = str(exc)
            return None

    every = ((a.label, b.label) for a, b in itertools.combinations(configs, 2))
    quick = {k: p for k in every if (p := compared(*k, 0)) is not None}
    told = _verdict_pairs(lay, by_label)
    full: dict[tuple[str, str], PairResult] = {}
    for _, a, b in told:
        if a != b and (a, b) not in full and (p := compared(a, b, n_boot)) is not None:
            full[(a, b)] = p
    lines: list[str | None] = [fastest(configs, response), engines_line(data, by_label)]
    for prefix, a, b in told:
        if prefix == _AT_BEST and any((x, y) == (a, b) for p, x, y in told if p == _AT_DEFAULTS):
            reasons = {lay.why_untuned(x, by_label) for x in (a, b)}
            lines.append(
                prefix
                + (
                    "tuning kept llama.cpp's defaults for both, so the answer above stands."
                    if all(r.endswith("keeps llama.cpp's defaults") for r in reasons)
                    else "no tuned variant to compare yet (" + "; ".join(sorted(reasons)) + ")."
                )
            )
        elif a != b and (a, b) in full:
            lines.append(prefix + verdict(full[(a, b)], band))
            lines.append(apart_note(data, a, b))
        elif a != b:
            lines.append(f"{prefix}{a} vs {b} {NOT_COMPARABLE}: {apart[(a, b)]}.")
    best = {b: v for b, v in lay.tuned.items() if v in by_label}
    if best:
        bases = [b for b in lay.bases if b in by_label]
        lines += [
            penalty_line(bases[0], o, best, by_label, response, band, lambda c: lay.why_untuned(c, by_label))
            for o in bases[1:]
        ]
    study = data.study_record()
    lines += [
        f"{name} asks llama.cpp the same as {kept}: measured once, as {kept}."
        for name, kept in (study.same_as if study is not None else ())
    ]
    # on cached turns also what tuning bought each configuration: where a configuration that holds no cached turn
    # takes part in every told pair (a placement for a short context), that is the only comparison they allow
    lines += cached_verdicts(data, [*told, *((_TUNED, b, v) for b, v in best.items())], response, configs)
    lines += your_turns.verdicts(data, configs, [*((a, b) for _, a, b in told), *best.items()])
    lines += [shape_line(data), drift_line(data, configs, response), *open_lines(tuple(full.values()))]
    if lines[1] is not None:  # builds compared: each runs at its own build's defaults
        own = "each build's defaults" if lines[1].startswith("Builds") else "each engine's defaults"
        lines = [v.replace("llama.cpp's defaults", own) if v else v for v in lines]
    verdicts = tuple(v for v in lines if v)
    pairs = tuple(full.get(k, v) for k, v in quick.items())
    headline = tuple(full.values())
    matrix = pair_matrix(configs, quick) if len(configs) >= 3 else None
    images: list[tuple[str, str, bytes]] = []
    if configs:
        images.append(
            (
                "total",
                "Total time per turn vs prompt length",
                plots.total_time_plot(configs, headline, response, band, base_of=lay.base_of),
            )
        )
        images.append(("ttft", "Cold time to first token vs prompt length", plots.ttft_plot(configs)))
    images += your_turns.images(data)
    depth = plots.depth_plot(data.bench)
    if depth is not None:
        images.append(("depth", "llama-bench prefill and decode vs depth", depth))
    incomparable: dict[frozenset[str], tuple[str, str, str]] = {}
    for (a, b), why in apart.items():
        incomparable.setdefault(frozenset((a, b)), (a, b, why))
    return Report(
        data,
        response,
        band,
        configs,
        pairs,
        verdicts,
        tuple(images),
        headline,
        matrix,
        lay,
        tuple(incomparable.values()),
    )


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def point_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The seed's table: per config and length, llama-bench prefill t/s (avg ± sd at depth L) and cold TTFT."""
    data = report.data
    pp: dict[tuple[str, int], tuple[float, float]] = {}
    for label, r in data.bench:
        if r.n_prompt and not r.n_gen:
            pp[(label, r.n_depth)] = (r.avg_ts, r.stddev_ts)
    ttft: dict[tuple[str, int], list[float]] = defaultdict(list)
    decode: dict[tuple[str, int], list[tuple[float, int]]] = defaultdict(list)
    for label, s in data.cold_samples():
        ttft[(label, s.length)].append(s.first_token_ns / 1e6)  # type: ignore[operator]
        if s.timings is not None and s.timings.predicted_per_second and s.timings.predicted_n:
            decode[(label, s.length)].append((s.timings.predicted_per_second, s.timings.predicted_n))
    lengths = sorted({L for _, L in ttft} | {d for _, d in pp})
    header = [
        "config",
        "prompt / depth",
        "llama-bench pp t/s (avg ± sd)",
        "cold TTFT ms (median [min-max], n)",
        "prefill t/s from TTFT",
        "decode t/s through llama-server (median, tokens generated)",
    ]
    rows = []
    for label in data.config_labels():
        for L in lengths:
            b = pp.get((label, L))
            t = ttft.get((label, L))
            if b is None and not t:
                continue
            tcell, rate, dcell = "—", "—", "—"
            if t:
                summary = summarize(t)
                tcell = f"{summary.median:.1f} [{summary.minimum:.1f}-{summary.maximum:.1f}], n={summary.n}"
                rate = f"{L / (summary.median / 1000):.0f}"
            d = decode.get((label, L))
            if d:
                counts = "/".join(str(n) for n in sorted({n for _, n in d}))
                dcell = f"{summarize([r for r, _ in d]).median:.1f} ({counts})"
            rows.append([label, format_tokens(L), f"{b[0]:.2f} ± {b[1]:.2f}" if b else "—", tcell, rate, dcell])
    return header, rows


def _stored_advice(data: StudyData) -> Advice | None:
    """The latest `xover advise` result stored in the study, if any."""

    found = data.artifact_bodies(ARTIFACT)
    return advice_from_dict(found[-1]) if found else None


def _first_crossover(report: Report) -> float | None:
    """The first measured crossover any pair's verdict claims (noise is no crossover), for the session verdict."""
    found = [c.length for p in report.pairs if (c := claimed_crossing(p)) is not None and not c.fitted]
    return min(found) if found else None


def _pair_details(p: PairResult) -> str:
    """The crossover arithmetic behind a pair's verdict, for the HTML page."""
    fitted = (
        ", ".join(f"{c.length:.0f} ({c.kind}{', extrapolated' if c.extrapolated else ''})" for c in p.fitted) or "none"
    )
    ci = f"{p.ci[0]:.0f}-{p.ci[1]:.0f} tokens" if p.ci else "not defined"
    none = (
        f" ({100 * p.ci_no_crossing_fraction:.0f}% of resamples had no crossing)" if p.ci_no_crossing_fraction else ""
    )
    interp = ", ".join(f"{c.length:.0f} ({c.kind})" for c in p.interpolated) or "none in range"
    return (
        f"<p>{_e(p.a)} vs {_e(p.b)}: interpolated crossover of the medians {_e(interp)}; fitted {_e(fitted)}; "
        f"bootstrap 95% interval {_e(ci)}{_e(none)}.</p>"
    )


_MATRIX_NOTE = (
    "Each cell reads the row's configuration against the column's, total time per turn: faster, slower, "
    "within noise (sample ranges overlap at every length), or where the faster one changes; lengths "
    "within noise are named. The same rules as the verdicts."
)
_MATRIX_NOTE_ROUNDS = (
    "Each cell reads the row's configuration against the column's, total time per turn: faster, slower, "
    "indistinguishable (over the rounds of fresh servers, the 95% interval of their ratio includes 1 at every "
    f"length), not yet compared (fewer than {MIN_ROUNDS} rounds shared), or where the faster one changes; lengths where they "
    "are indistinguishable are named. The same rules as the verdicts."
)


def _matrix_note(pairs: Sequence[PairResult]) -> str:
    return _MATRIX_NOTE_ROUNDS if any(p.in_rounds for p in pairs) else _MATRIX_NOTE


def _matrix_html(m: Matrix) -> str:
    head = "<th></th>" + "".join(f"<th>{_e(lb)}</th>" for lb in m.labels)
    body = "".join(
        f"<tr><th>{_e(lb)}</th>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>"
        for lb, row in zip(m.labels, m.cells)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _matrix_markdown(m: Matrix) -> str:
    return plain_md_table(["", *m.labels], [[lb, *row] for lb, row in zip(m.labels, m.cells)])


def _cached_blocks(report: Report) -> list[Block]:
    return cached_blocks(report.data, report.response)


def _chat_blocks(report: Report) -> list[Block]:
    return chat_blocks(report.data, [(p.a, p.b) for p in report.headline])


TURN_SECTIONS: dict[str, Callable[[Report], list[Block]]] = {"chat": _chat_blocks, "cached": _cached_blocks}
"""The report's section of each kind of turn measured after the cold prompts (:data:`xover.domain.turn_kinds.
AFTER_COLD`, by name), after the tuning and decode sections; the cold prompts are the report's main body."""


def _turn_sections(report: Report) -> list[list[Block]]:
    return [TURN_SECTIONS[kind.name](report) for kind in AFTER_COLD]


def _decode_blocks(report: Report) -> list[Block]:
    return decode_blocks(report.data, report.layout or layout(report.data))


def _tune_blocks(report: Report) -> list[Block]:
    if report.layout is None:
        return []
    return list(
        blocks(
            report.layout,
            Measured(
                {c.label: c for c in report.configs},
                report.data.bench,
                report.data.cold_samples(),
                report.response,
                report.band,
                turns_workload(report.data, report.response),
                {c.label: c.engine for c in report.data.configs},
            ),
        )
    )


def _measurement_samples(data: StudyData) -> list[tuple[str, TtftSample]]:
    """TTFT samples of the cold/warm measurements (the cache lab's have their own section)."""
    return [(lb, s) for lb, s in data.ttft if s.mode in TTFT_MODES]


def cold_check_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    groups: dict[tuple[str, str, int], list[bool]] = defaultdict(list)
    for label, s in _measurement_samples(data):
        groups[(label, s.mode, s.length)].append(s.cache_ok and s.error is None)
    header = ["config", "mode", "length", "passed / stored", "re-runs (failed check or error)"]
    rows = [
        [lb, mode, format_tokens(L), f"{sum(v)} / {len(v)}", str(len(v) - sum(v))]
        for (lb, mode, L), v in groups.items()
    ]
    return header, rows


def skipped_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """The lengths not measured because a configuration was too slow for them (artifact ``ttft-skipped``)."""
    header = ["config", "prompt", "estimated cold TTFT", "from the samples at", "max-ttft"]
    rows = [
        [lb, format_tokens(L), f"{p.estimate_s:.0f} s", format_tokens(p.from_length), f"{p.max_ttft_s:.0f} s"]
        for (lb, L), p in sorted(data.skipped_points().items())
    ]
    return header, rows


_POINT_NOTE = (
    "llama-bench's pp @ dN is the speed of the new tokens on top of an untimed, cached depth prefill; TTFT is the "
    "cold wall-clock wait for the first streamed token through llama-server. The decode column is llama-server's "
    "own speed over the tokens those cold requests generated: the decode_tok_s(L) that "
    "total(L) = TTFT(L) + R / decode_tok_s(L) uses for R-token responses."
)

_SKIPPED_NOTE = (
    "Not measured: the study's max-ttft skips a length whose cold TTFT, scaled linearly from the longest shorter "
    "length measured on the configuration, would exceed it. Verdicts compare the lengths both configurations have."
)


def gap_table(data: StudyData) -> tuple[list[str], list[list[str]]]:
    """Client TTFT minus the server's prompt_ms: HTTP, tokenization, slot selection, state saving."""
    gaps: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for label, s in _measurement_samples(data):
        if s.first_token_ns is not None and s.timings is not None and s.timings.prompt_ms is not None:
            gaps[(label, s.mode, s.length)].append(s.first_token_ns / 1e6 - s.timings.prompt_ms)
    header = ["config", "mode", "length", "gap ms (median)", "gap ms (max)"]
    rows = []
    for (lb, mode, L), v in gaps.items():
        summary = summarize(v)
        rows.append([lb, mode, format_tokens(L), f"{summary.median:.2f}", f"{summary.maximum:.2f}"])
    return header, rows


def attention_table(report: Report) -> tuple[list[str], list[list[str]]]:
    header = ["config", *[format_tokens(L) for L in sorted({L for c in report.configs for L in c.ttft_s})]]
    rows = []
    for c in report.configs:
        m = fit_cost_model(c)
        rows.append([c.label, *[f"{100 * m.quadratic_share(L):.1f}%" for L in sorted(c.ttft_s)]])
    return header, rows


def prediction_timing(data: StudyData) -> str | None:
    """When the prediction was stored against the first measurement, in words, from the stored clocks."""
    pred = data.prediction()
    if pred is None:
        return None
    made = pred.created_unix_ns
    starts = [r.start_ns for r in data.runs if r.kind != "predict"]
    first = min(starts) if starts else None
    if first is None:
        return f"prediction stored at {pred.created_at}; nothing measured yet"
    order = "before" if made < first else "AFTER"
    return (
        f"prediction stored at {pred.created_at}, {abs(first - made) / 1e9:.2f} s {order} the first "
        "measurement started" + ("" if made < first else " (it cannot count as a blind prediction)")
    )


def prediction_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """Every measured point beside its prediction and its roofline limit (percent of the limit)."""

    pred = report.data.prediction()
    header = [
        "config",
        "L",
        "TTFT ms measured / predicted (error)",
        "pp t/s @ dL measured / limit (% of limit)",
        "tg t/s @ dL measured / limit (% of limit)",
    ]
    if pred is None:
        return header, []
    pred = pred.relabelled()
    pp: dict[tuple[str, int], float] = {}
    tg: dict[tuple[str, int], float] = {}
    for label, r in report.data.bench:
        if r.n_prompt and not r.n_gen:
            pp[(label, r.n_depth)] = r.avg_ts
        elif r.n_gen and not r.n_prompt:
            tg[(label, r.n_depth)] = r.avg_ts

    def cell(measured: float | None, predicted: float | None, as_limit: bool, fmt: str) -> str:
        if measured is None:
            return "—"
        if predicted is None or predicted <= 0:
            return f"{measured:{fmt}} / —"
        if as_limit:
            flag = " ABOVE THE MODELLED LIMIT" if measured > 1.05 * predicted else ""
            return f"{measured:{fmt}} / {predicted:{fmt}} ({100 * measured / predicted:.0f}%){flag}"
        return f"{measured:{fmt}} / {predicted:{fmt}} ({100 * (measured - predicted) / predicted:+.0f}%)"

    rows = []
    ttft: dict[tuple[str, int], list[float]] = defaultdict(list)
    for label, s in report.data.cold_samples():
        ttft[(label, s.length)].append(s.first_token_ns / 1e6)  # type: ignore[operator]
    keys = sorted(
        set(ttft) | set(pp) | set(tg),
        key=lambda k: (report.data.config_labels().index(k[0]) if k[0] in report.data.config_labels() else 99, k[1]),
    )
    for label, L in keys:
        t = summarize(ttft[(label, L)]).median if ttft.get((label, L)) else None
        pt = predicted_value(pred, label, L, "ttft_s")
        rows.append(
            [
                label,
                format_tokens(L),
                cell(t, pt * 1000 if pt is not None else None, False, ".1f"),
                cell(pp.get((label, L)), predicted_value(pred, label, L, "limit_pp_tps"), True, ".0f"),
                cell(tg.get((label, L)), predicted_value(pred, label, L, "limit_decode_tps"), True, ".0f"),
            ]
        )
    return header, rows


def _load_note(p: object) -> str:
    extra = dict(getattr(p, "extra", ()) or ())
    if "loadavg_1m" not in extra:
        return ""
    note = f"; load {extra['loadavg_1m']} on {extra.get('cpu_count', '?')} CPUs at start"
    try:
        if "cpu_busy" in extra:  # measured at the start; the load average lags by a minute
            note += f", CPUs {float(extra['cpu_busy']):.0%} busy"
            busy = float(extra["cpu_busy"]) > 0.5
        else:
            busy = float(extra["loadavg_1m"]) > 0.5 * float(extra.get("cpu_count", "0"))
    except ValueError:
        busy = False
    return note + (" (BUSY: other work skews these timings)" if busy else "")


def _engine_prefix(p: Provenance) -> str:
    """The engine before its build where it is not mainline (runs stored before xover recorded it have none)."""
    return f"{p.llama_engine} " if p.llama_engine not in (None, "llama.cpp") else ""


def _devices_note(p: Provenance) -> str:
    """The devices a run used and their driver, where stored (runs before xover checked backends have neither)."""
    extra = dict(p.extra)
    parts = [extra[k] for k in ("devices", "driver") if extra.get(k)]
    return f" on {'; driver '.join(parts)}" if parts else ""


def provenance_rows(data: StudyData) -> list[list[str]]:
    rows = []
    for r in data.runs:
        p = r.provenance
        model = p.model
        rows.append(
            [
                str(r.id),
                r.kind,
                r.started_at,
                r.status,
                f"{_engine_prefix(p)}{p.llama_build_commit} (build {p.llama_build_number}), "
                f"{backend_name(p.llama_backend or '')}{_devices_note(p)}",
                f"{p.cpu_info or '?'}; GPU: {p.gpu_info or 'none'}; host {p.hostname}{_load_note(p)}",
                f"{model.name}, {model.size_bytes / 1e9:.3f} GB, header sha256 {model.header_sha256[:12]}"
                if model
                else "—",
                " ".join(r.command),
            ]
        )
    return rows


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.9em;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f4f4f4}.verdict{background:#eef6ee;border-left:4px solid #3a3;padding:.5em 1em;margin:.4em 0}
img{max-width:100%;border:1px solid #eee}.muted{color:#777}code{background:#f4f4f4;padding:0 .2em}
"""


def _fa_section(data: StudyData) -> tuple[list[str], list[list[str]], list[str]] | None:
    """The flash-attention comparison, when the study ran the same tests with -fa changed only."""

    tests = fa_tests(data.bench)
    if not tests:
        return None
    memory = {
        body["config_key"]: body
        for body in data.artifact_bodies("memory")
        if body.get("source") == "llama-bench" and "config_key" in body
    }
    header, rows = fa_table(tests)
    return header, rows, fa_findings(tests, memory)


def budget_lines(d: StudyData) -> list[str]:
    """What a VRAM budget emulates and what it does not, for the top of every report page."""
    out = []
    for b in vram_budgets(d):
        gpu = f"an {b.gpu.split(',')[0]}" if b.gpu else f"GPU {b.device}"
        out.append(
            f"{b.budget / 2**30:.0f} GiB VRAM budget on {gpu} ({b.total / 2**30:.0f} GiB): xover held the "
            f"rest, so llama.cpp saw a card of {b.budget / 2**30:.0f} GiB. The host's PCIe link, CPU cores and "
            "memory bandwidth are this machine's, not a desktop's: prefill with experts on the CPU and decode "
            "transfer to another machine only through the theory."
            + (
                f" {b.short_runs} run{'s' if b.short_runs > 1 else ''} found up to {b.most_short / 2**20:,.0f} MiB "
                "of the budget taken by another process (vram_shortfall in their provenance): they measured a "
                "smaller card than the budget."
                if b.short_runs
                else ""
            )
        )
    return out


def _lab_sections(report: Report, as_html: bool) -> list[str]:
    """The cache lab, the stored advice and the session replay, rendered as HTML or markdown."""

    d = report.data
    out = [(cache.cache_section_html if as_html else cache.cache_section_markdown)(d)]
    advice = _stored_advice(d)
    if advice is not None:
        out.append((advise.advise_section_html if as_html else advise.advise_section_markdown)(advice))
    if d.session:
        render = session.session_section_html if as_html else session.session_section_markdown
        out.append(render(d.session, crossover_tokens=_first_crossover(report), cached=cached_ttft(d)))
    return out


def render_html(report: Report) -> str:
    d = report.data
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>xover report: {_e(Path(d.study_dir).name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>xover report <span class='muted'>{_e(Path(d.study_dir).name)}</span></h1>",
    ]
    parts += [f"<p class='budget'><strong>{_e(line)}</strong></p>" for line in budget_lines(d)]
    commands = command_blocks(d)  # the user's own command and what to change in it, first
    if commands:
        parts.append(section_html(commands))
    parts.append("<h2>Verdict</h2>")
    evidence = evidence_line(d)
    if evidence is not None:
        parts.append(f"<p class='muted'>{_e(evidence)}</p>")
    if report.verdicts:
        parts += [f"<p class='verdict'>{_e(v)}</p>" for v in report.verdicts]
    else:
        parts.append(
            "<p class='muted'>Fewer than two configurations with cold TTFT and decode data: no crossover to compute.</p>"
        )
    parts += [_pair_details(p) for p in report.headline]
    if report.matrix is not None:
        told = {(p.a, p.b) for p in report.headline}
        rest = [p for p in report.pairs if (p.a, p.b) not in told]
        parts.append(
            f"<details><summary>Every pair of configurations ({len(report.matrix.labels)} configurations, "
            f"{len(report.pairs)} pairs)</summary><p class='muted'>{_e(_matrix_note(report.pairs))}</p>"
            f"{_matrix_html(report.matrix)}{''.join(_pair_details(p) for p in rest)}</details>"
        )
    for img_id, caption, png in report.images:
        b64 = base64.b64encode(png).decode()
        parts.append(
            f"<h2>{_e(caption)}</h2><img id='plot-{_e(img_id)}' alt='{_e(caption)}' src='data:image/png;base64,{b64}'>"
        )
    for section in (rounds_blocks(d, report.configs, report.response), fit_blocks(d), rpc_link_blocks(d)):
        if section:
            parts.append(section_html(section))
    parts.append(section_html(_tune_blocks(report)))
    parts.append(section_html(_decode_blocks(report)))
    for turns in (*_turn_sections(report), your_turns.blocks(d, report.configs)):
        if turns:
            parts.append(section_html(turns))
    desktop = translation_blocks(d, report.response)
    if desktop:
        parts.append(section_html(desktop))
    parts.append(f"<h2>Prefill and TTFT per configuration and length</h2>{html_table(*point_table(report))}")
    parts.append(f"<p class='muted'>{_e(_POINT_NOTE)}</p>")
    header, rows = skipped_table(d)
    if rows:
        parts.append(f"<h3>Not measured: too slow</h3><p>{_e(_SKIPPED_NOTE)}</p>{html_table(header, rows)}")
    if report.configs:
        parts.append(
            f"<h2>Attention's share of TTFT (quadratic term of the fitted model)</h2>{html_table(*attention_table(report))}"
        )
    timing = prediction_timing(d)
    if timing is not None:
        pred = d.prediction()
        assumptions = "".join(f"<li>{_e(a)}</li>" for a in (pred.assumptions if pred is not None else ()))
        parts.append(
            f"<h2>Predicted vs measured</h2><p>{_e(timing)}.</p>{html_table(*prediction_table(report))}"
            "<p class='muted'>A measurement above its modelled limit means an assumption of the model does "
            "not hold for this run (for example a bandwidth figure of the hardware profile, such as the "
            "host-to-device rate of pageable memory); the limit is then not a bound.</p>"
            f"<details><summary>Assumptions of the prediction</summary><ul>{assumptions}</ul></details>"
        )
    fa = _fa_section(d)
    if fa is not None:
        header, rows, findings = fa
        parts.append(
            "<h2>Flash attention on vs off</h2>"
            + "".join(f"<p>{_e(f)}</p>" for f in findings)
            + html_table(header, rows)
        )
    parts.append(
        f"<h2>Cold check</h2><p>Every sample labelled cold must show <code>cache_n == 0</code> and "
        f"<code>prompt_n == L</code>; failures are re-run and never averaged.</p>{html_table(*cold_check_table(d))}"
    )
    parts.append(
        f"<h2>Client-server gap</h2><p>Client TTFT minus the server's <code>prompt_ms</code>.</p>{html_table(*gap_table(d))}"
    )
    parts += _lab_sections(report, as_html=True)
    if d.failures:
        rows = [[lb, f.stage, f.point, f.reason, f.stderr_tail[-300:]] for lb, f in d.failures]
        parts.append(
            f"<h2>Failures (kept as data)</h2>{html_table(['config', 'stage', 'point', 'reason', 'stderr tail'], rows)}"
        )
    parts.append(
        "<h2>Provenance</h2>"
        + html_table(
            ["run", "kind", "started", "status", "llama.cpp", "hardware", "model", "command"], provenance_rows(d)
        )
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def render_markdown(report: Report) -> str:
    d = report.data
    out = [
        f"# xover report: {Path(d.study_dir).name}\n",
        *(f"**{line}**\n" for line in budget_lines(d)),
        *([f"{commands}\n"] if (commands := section_markdown(command_blocks(d))) else []),
        "## Verdict\n",
    ]
    evidence = evidence_line(d)
    if evidence is not None:
        out += [f"_{evidence}_\n"]
    out += [f"- {v}" for v in report.verdicts] or ["- no pair of configurations with cold TTFT and decode data"]
    if report.matrix is not None:
        out += [
            "",
            "### Every pair of configurations\n",
            _matrix_note(report.pairs) + "\n",
            _matrix_markdown(report.matrix),
        ]
    for section in (rounds_blocks(d, report.configs, report.response), fit_blocks(d), rpc_link_blocks(d)):
        text = section_markdown(section)
        if text:
            out += ["", text]
    for section in (
        _tune_blocks(report),
        _decode_blocks(report),
        *_turn_sections(report),
        your_turns.blocks(d, report.configs),
    ):
        text = section_markdown(section)
        if text:
            out += ["", text]
    desktop = section_markdown(translation_blocks(d, report.response))
    if desktop:
        out += ["", desktop]
    out += ["", "## Prefill and TTFT\n", plain_md_table(*point_table(report)), _POINT_NOTE + "\n"]
    header, rows = skipped_table(d)
    if rows:
        out += ["### Not measured: too slow\n", _SKIPPED_NOTE + "\n", plain_md_table(header, rows)]
    out += [
        "## Cold check\n",
        plain_md_table(*cold_check_table(d)),
        "## Client-server gap\n",
        plain_md_table(*gap_table(d)),
    ]
    fa = _fa_section(d)
    if fa is not None:
        header, rows, findings = fa
        out += ["## Flash attention on vs off\n", *(f"- {f}" for f in findings), "", plain_md_table(header, rows)]
    out += _lab_sections(report, as_html=False)
    timing = prediction_timing(d)
    if timing is not None:
        out += ["## Predicted vs measured\n", timing + ".\n", plain_md_table(*prediction_table(report))]
    out += [
        "## Provenance\n",
        plain_md_table(
            ["run", "kind", "started", "status", "llama.cpp", "hardware", "model", "command"], provenance_rows(d)
        ),
    ]
    return "\n".join(out)


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    """The one place that writes report files: report.html, report.md and the plots as PNG."""
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    html_path.write_text(render_html(report), encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    for img_id, _, png in report.images:
        (out_dir / f"plot-{img_id}.png").write_bytes(png)
    return html_path, md_path
