"""The advice of ``xover advise`` as a report section, in markdown and in HTML. Pure: an
:class:`~xover.analysis.advise.Advice` in, text out (every piece of text escaped for HTML).

Both renderers draw the same blocks (:func:`blocks`): the recommendation and the command line to
paste, the server confirmation, one table per offload level (each knob value's prefill, decode, TTFT,
time per turn and memory against the defaults, with the theory's expectation beside it), which knobs
had no effect, and the crossover of each pair of levels at the defaults and with the recommendation.
"""

from __future__ import annotations

from xover.analysis.advise import RECHECK, Advice, Search, Trial, setting_label, within_noise
from xover.analysis.crossover import PairResult
from xover.domain.units import format_tokens
from xover.report.blocks import Block, blocks_html, blocks_markdown


def _dur(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.0f}%"


def _rates(trial: Trial, kind: str) -> str:
    tests = trial.measurement.prefill if kind == "pp" else trial.measurement.decode
    if not tests:
        return "-"
    return f"{tests[0].median_tps:,.0f} → {tests[-1].median_tps:,.0f}"


def _level_table(advice: Advice, search: Search) -> Block:
    base = search.defaults.estimate
    assert base is not None
    depths = [r.depth for r in search.defaults.measurement.prefill]
    span = f"d{format_tokens(depths[0])} → d{format_tokens(depths[-1])}" if depths else ""
    header = (
        "configuration",
        f"prefill tok/s {span}",
        f"decode tok/s {span}",
        "TTFT (est.)",
        "time per turn",
        "vs defaults",
        "peak RSS",
        "GPU buffers",
        "theory expects",
    )
    rows = []
    for trial in search.trials:
        m, e = trial.measurement, trial.estimate
        mark = " ✓" if trial.setting == search.recommended else ""
        if e is None:
            rows.append((trial.label + mark, "failed", "-", "-", "-", "-", "-", "-", m.failure or ""))
            continue
        change = (
            "-"
            if trial.setting == ()
            else _pct(e.turn_s / base.turn_s) + (" (noise)" if within_noise(e, base, search.drift_s) else "")
        )
        expected = advice.expectation(search, trial.setting)
        theory = (
            "-"
            if expected is None
            else ((_pct(expected.change) + ": " if expected.change is not None else "") + expected.note)
        )
        reused = " (stored)" if m.reused else ""
        rows.append(
            (
                trial.label + mark + reused,
                _rates(trial, "pp"),
                _rates(trial, "tg"),
                _dur(e.ttft_s),
                f"{_dur(e.turn_s)} ± {_dur(e.spread_s / 2)}",
                change,
                _bytes(m.peak_rss_bytes),
                _bytes(m.device_bytes),
                theory,
            )
        )
    return Block("table", items=header, rows=tuple(rows))


def _verdicts(advice: Advice, search: Search) -> Block:
    items = []
    for v in search.verdicts:
        parts = []
        best = v.best
        if v.no_effect:
            parts.append("no effect on this hardware: every value within noise")
        elif v.kept is not None and best is not None:
            parts.append(f"kept {v.kept}: {_dur(-best.change_s)} faster per turn (noise {_dur(best.noise_s)})")
        elif best is not None:
            parts.append(
                "default kept: "
                + (
                    "no value beat it by more than the noise"
                    if best.change_s < 0
                    else f"the best value tried ({best.value}) is slower"
                )
            )
        if len(v.effects) > 1:
            parts += [f"{e.value}: {e.change_s:+.3g} s" + (" (noise)" if e.within_noise else "") for e in v.effects]
        if v.skipped:
            parts.append(f"not measured: {', '.join(v.skipped)} (what llama.cpp runs by default here)")
        if v.failed:
            parts.append(f"failed: {', '.join(v.failed)}")
        items.append(f"{v.knob}: {'; '.join(parts) or 'no candidate values'}")
    again = search.trial(RECHECK).estimate if any(t.setting == RECHECK for t in search.trials) else None
    if again is not None and search.drift_s is not None and search.defaults.estimate is not None:
        first = search.defaults.estimate.turn_s
        items.append(
            f"defaults measured again after the knobs: {_dur(again.turn_s)} per turn against {_dur(first)} "
            f"at first (drift {_dur(search.drift_s)}, {search.drift_s / first:.1%}), counted as noise in "
            "every decision above"
        )
    none = advice.no_effect(search)
    if none:
        items.append(f"no effect on this hardware (within measurement noise): {', '.join(none)}")
    items += [f"doubt: {d}" for d in advice.doubts(search)]
    return Block("ul", items=tuple(items))


def _pair_text(p: PairResult) -> str:
    crosses = [c for c in p.interpolated if c.kind == "cross"]
    lo, hi = format_tokens(p.lengths[0]), format_tokens(p.lengths[-1])
    first, last = p.faster_at(0), p.faster_at(len(p.lengths) - 1)
    if len(crosses) == 1:
        return f"{first} faster below ~{format_tokens(crosses[0].length)} tokens, {last} above"
    if crosses:
        at = ", ".join(f"~{format_tokens(c.length)}" for c in crosses)
        return f"{first} faster at {lo}, {last} at {hi}; the faster one changes at {at} tokens"
    beyond = [c for c in p.fitted if c.kind == "cross" and c.length > p.lengths[-1]]
    tail = f"; the fitted costs cross at ~{format_tokens(beyond[0].length)} (extrapolated)" if beyond else ""
    return f"{p.faster_at(0)} faster at every length measured ({lo}-{hi}){tail}"


def _confirmation_blocks(advice: Advice) -> list[Block]:
    """Whether llama-server confirmed the recommendation, with its table; or how to confirm it."""
    best = advice.best
    out: list[Block] = []
    c = advice.confirmation
    if c is not None:
        where = (
            f"cold TTFT and decode, {c.repetitions} repetitions at "
            f"{', '.join(format_tokens(p.length) for p in c.defaults)} tokens"
        )
        if c.gain < 1:
            out.append(
                Block(
                    "p",
                    f"NOT confirmed through llama-server ({where}): the recommendation was slower than the "
                    f"defaults, {_dur(c.recommended_turn_s)} against {_dur(c.defaults_turn_s)} per turn, "
                    f"{c.gain:.2f}x (llama-bench estimated {best.gain:.2f}x). Keep the defaults, or rerun "
                    "on a quieter machine.",
                )
            )
        else:
            out.append(
                Block(
                    "p",
                    f"Confirmed through llama-server ({where}): {_dur(c.recommended_turn_s)} against "
                    f"{_dur(c.defaults_turn_s)} per turn, {c.gain:.2f}x (llama-bench estimated {best.gain:.2f}x).",
                )
            )
        out.append(
            Block(
                "table",
                items=(
                    "prompt tokens",
                    "TTFT defaults",
                    "TTFT recommended",
                    "decode tok/s defaults",
                    "decode tok/s recommended",
                ),
                rows=tuple(
                    (
                        format_tokens(d.length),
                        _dur(d.ttft_s),
                        _dur(r.ttft_s),
                        f"{d.decode_tps:,.1f}",
                        f"{r.decode_tps:,.1f}",
                    )
                    for d, r in zip(c.defaults, c.recommended)
                ),
            )
        )
    elif best.recommended != ():
        out.append(
            Block(
                "p",
                "Not confirmed through llama-server: run xover advise with --confirm, or xover ttft with "
                "the two configurations.",
            )
        )
    return out


def blocks(advice: Advice) -> list[Block]:
    """The section, as blocks both renderers draw."""
    best = advice.best
    b, d = best.best.estimate, best.defaults.estimate
    assert b is not None and d is not None
    measured = sorted({r.depth for r in best.defaults.measurement.prefill}) or list(advice.workload.depths())
    depths = ", ".join(format_tokens(x) for x in measured)  # the depths measured (the plan may measure fewer)
    out = [
        Block("h2", "Shrinking the prefill penalty: llama.cpp settings (xover advise)"),
        Block(
            "ul",
            items=(
                f"model {advice.model}; llama.cpp backend {advice.backend}; hardware {advice.hardware}",
                f"workload {advice.workload.describe()}"
                + (f" ({advice.workload_note})" if advice.workload_note else ""),
                (
                    f"{advice.measurements} llama-bench measurements ({advice.reused} found in the store): one knob at a time "
                    f"from llama.cpp's defaults, then the kept values together; each pp{advice.chunk} and tg{advice.n_gen} at "
                    f"depths {depths}, {advice.repetitions} repetitions"
                ),
                (
                    "TTFT(L) is estimated by integrating prefill time per token over depth (pp @ dN gives it at the middle of its "
                    "chunk, linear in between); time per turn = TTFT(L) + R / decode tok/s(L), averaged over the workload"
                ),
                (
                    "noise: a difference no larger than the two configurations' spreads (max - min of their "
                    "per-repetition estimates) added, or than the drift of the defaults measured again at the end; load "
                    "that changes between measurements, minutes apart on a shared machine, is only partly in that: raise "
                    "-r or rerun to check a small effect"
                ),
            ),
        ),
    ]
    rec = setting_label(advice.knobs, best.recommended)
    if best.recommended == ():
        out.append(
            Block(
                "p",
                f"Recommendation: llama.cpp's defaults at {best.label} ({_dur(d.turn_s)} per turn): "
                "no setting tried beat them by more than the noise.",
            )
        )
    else:
        out.append(
            Block(
                "p",
                f"Recommendation: {best.label} {rec}: {_dur(b.turn_s)} per turn against {_dur(d.turn_s)} "
                f"with llama.cpp's defaults at {best.label}, {best.gain:.2f}x faster (measured, llama-bench).",
            )
        )
    out.append(Block("code", advice.command()))
    out += _confirmation_blocks(advice)
    others = [s for s in advice.searches if s is not best]
    for s in others:
        e, de = s.best.estimate, s.defaults.estimate
        assert e is not None and de is not None
        if s.recommended == ():
            out.append(Block("p", f"At {s.label}: llama.cpp's defaults stay best ({_dur(de.turn_s)} per turn)."))
        else:
            out.append(
                Block(
                    "p",
                    f"At {s.label}: {setting_label(advice.knobs, s.recommended)} {_dur(e.turn_s)} per turn "
                    f"against {_dur(de.turn_s)} at the defaults ({s.gain:.2f}x).",
                )
            )
    for s in advice.searches:
        out.append(
            Block("h3", f"{s.label}: one knob at a time from llama.cpp's defaults ({s.measurements} measurements)")
        )
        out.append(_level_table(advice, s))
        out.append(_verdicts(advice, s))
    if advice.crossovers:
        out.append(Block("h3", "The crossover, revisited"))
        out.append(
            Block(
                "table",
                items=("pair", "at llama.cpp's defaults", "with each level's recommended settings"),
                rows=tuple(
                    (f"{p.a} vs {p.b}", _pair_text(p.at_defaults), _pair_text(p.with_knobs)) for p in advice.crossovers
                ),
            )
        )
    return out


def advise_section_markdown(advice: Advice) -> str:
    return blocks_markdown(blocks(advice), rule=" --- ")


def advise_section_html(advice: Advice) -> str:
    return "\n".join(['<section class="advise">', *blocks_html(blocks(advice)), "</section>"])
