"""The study's tuning stage as report sections: which llama.cpp knobs each configuration's search
changed and what each did to prefill and to decode (never folded into one score), and whether the
gain llama-bench measured shows through llama-server. Pure: stored artifacts and measurements in,
text out; :func:`section_html` escapes every piece of text.

Inputs, from the store alone: artifacts ``tune`` (one per base configuration: the search, the tuned
variant's name or null when the defaults were kept, its flags and command line) and ``study`` (base
configurations in spec order and the headline pairs; optional, older stores lack it).

**Per-knob effects** come from the search's llama-bench trials, pooled over the measured depths: each
repetition's rate is its tokens over its time summed across the depths' tests (a rate over all
depths, each test weighted by its tokens), so the spread is the repetitions' and not the depths'.
The defaults pool both of their measurements (first, and again after the knobs), so drift between
the two counts as noise. A change is *within noise* when the two sets of repetition rates overlap.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from xover.analysis.advise import DEFAULTS, Setting, again, estimate, pairs_label
from xover.analysis.advise.objective import noise_between
from xover.analysis.crossover import ConfigData, verdict
from xover.analysis.rounds import MIN_ROUNDS, possessive
from xover.analysis.tradeoff import Ratio, ServedTradeoff, Tradeoff, ratio, served_tradeoff, tradeoff
from xover.domain import llama_options as opts
from xover.domain.artifacts import TUNED, FitRecord, TuneRecord
from xover.domain.records import RETRY_HINT, BenchResult, TtftSample, interrupted
from xover.domain.units import format_tokens
from xover.report.blocks import Block, blocks_html, blocks_markdown, table
from xover.results.read_model import StudyData

GAIN_SHOWN = 0.5  # a served gain below half the llama-bench gain counts as not seen through llama-server


# ---- the layout -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a study's configurations relate: base configurations in spec order, each one's tuned
    variant (when tuning changed a knob), and the headline pairs its verdicts answer."""

    bases: tuple[str, ...]
    tuned: dict[str, str]  # base -> tuned variant label
    pairs: tuple[tuple[str, str], ...]  # the study's headline pairs as stored (may be empty)
    records: tuple[TuneRecord, ...]
    for_decode: dict[str, str] = dataclasses.field(default_factory=dict)  # base -> its variant tuned for decode

    def best(self, base: str) -> str:
        """The configuration at its best: its tuned variant, or itself when tuning kept the defaults."""
        return self.tuned.get(base, base)

    def why_untuned(self, base: str, measured: Collection[str]) -> str:
        """Why ``base`` stands for itself at its best: its search kept the defaults, it has no search, or its
        tuned variant has no measurements to compare yet."""
        record = next((r for r in self.records if r.config == base), None)
        if record is None:
            return f"{base} was not tuned"
        if record.interrupted:
            return f"{base}'s tuning is incomplete: {record.interrupted[0]}; {RETRY_HINT}"
        if record.variant is None:
            return f"{base} keeps llama.cpp's defaults"
        if record.variant not in measured:
            return f"{record.variant} is not measured through llama-server yet"
        return f"{base} keeps llama.cpp's defaults"

    def family(self, base: str) -> tuple[str, ...]:
        """A base configuration, then its tuned variant and its variant tuned for decode, where they exist."""
        return tuple(x for x in (base, self.tuned.get(base), self.for_decode.get(base)) if x is not None)

    @property
    def base_of(self) -> dict[str, str]:
        return {v: b for b, v in (*self.tuned.items(), *self.for_decode.items())}


def layout(data: StudyData) -> Layout:
    """The layout from the study's ``study`` and ``tune`` artifacts; without a ``study`` artifact the bases are the
    labels (first-seen order) that are no configuration's tuned variant, and there are no stored pairs."""
    placed = {c.config: c for c in data.fit_records(TUNED, checked=True) or ()}
    study = data.study_record()
    # the configurations the study measured, and those measured once under another's name
    names = {*study.configs, *(name for name, _ in study.same_as)} if study is not None else None
    records = tuple(_rounds_of(_placed(r, placed.get(str(r.variant))), names) for r in data.tune_results())
    tuned = {r.config: r.variant for r in records if r.variant}
    for_decode = {r.config: r.decode_variant for r in records if r.decode_variant}
    variants = {*tuned.values(), *for_decode.values()}
    spec_order = [c for c in study.configs if c not in variants] if study is not None else []
    bases = tuple(dict.fromkeys([*spec_order, *(lb for lb in data.config_labels() if lb not in variants)]))
    return Layout(bases, tuned, study.pairs if study is not None else (), records, for_decode)


def _rounds_of(r: TuneRecord, configs: set[str] | None) -> TuneRecord:
    """``r`` as the study last ran it (``configs``: its configurations): a search left its recommendation to the
    rounds of another configuration (``same_as``), which a later run of a changed spec, resuming the stored search,
    may no longer measure. Then the variant was measured as itself, and no other configuration's rounds confirm it
    (nor, ``origin_same_as``, the gain of the origin it extends)."""
    if configs is None:
        return r
    return dataclasses.replace(
        r,
        same_as=r.same_as if r.same_as in configs else None,
        origin_same_as=r.origin_same_as if r.origin_same_as in configs else None,
    )


def _placed(r: TuneRecord, entry: FitRecord | None) -> TuneRecord:
    """A tuned variant of a ``fit`` configuration is placed again for its own settings (``entry``: its record in
    the latest ``fit-check-tuned`` artifact): its command shows the level it was measured at, and a note says so."""
    if r.variant is None or entry is None:
        return r
    level = entry.level
    m = re.search(r"(?:-ncmoe|--n-cpu-moe) (\d+)", r.server_command)
    if m is None or int(m.group(1)) == level:
        return r
    if r.placed_trials:
        note = (
            f"Under the budget each trial was placed for its own ubatch and KV cache types: the variant runs at --n-cpu-moe {level} "
            f"(its base at {m.group(1)}) to hold {entry.n_ctx:,} tokens with ubatch {entry.ubatch} "
            "(see Fit), as it was searched and measured."
        )
    else:
        note = (
            f"Searched at --n-cpu-moe {m.group(1)}; with ubatch {entry.ubatch} the variant needs "
            f"--n-cpu-moe {level} to hold {entry.n_ctx:,} tokens under the budget (see Fit), and it was "
            "measured there."
        )
    command = r.server_command[: m.start(1)] + str(level) + r.server_command[m.end(1) :]
    return dataclasses.replace(r, server_command=command, note=" ".join(filter(None, (r.note, note))))


# ---- per-knob effects -----------------------------------------------------------------------------


def pooled_rates(tests: Sequence[Any]) -> list[float]:
    """Per repetition i: tokens over time summed across the tests (``RateSamples``), tokens/s."""
    tests = [t for t in tests if t.samples_tps]
    if not tests:
        return []
    reps = min(len(t.samples_tps) for t in tests)
    return [sum(t.tokens for t in tests) / sum(t.tokens / t.samples_tps[i] for t in tests) for i in range(reps)]


def _trial_rates(trials: Sequence[Any]) -> tuple[list[float], list[float]]:
    """Pooled prefill and decode repetition rates of one or more trials (their samples together)."""
    pp, tg = [], []
    for t in trials:
        m = t.measurement
        if m.failure is None:
            pp += pooled_rates(m.prefill)
            tg += pooled_rates(m.decode)
    return pp, tg


@dataclasses.dataclass(frozen=True)
class KnobRow:
    knob: str
    value: str
    status: str  # "kept", "not kept ...", "no effect", "not measured ...", "failed"
    effect: Tradeoff | None  # the value against the defaults (A: defaults, B: the value)
    turn_change_s: float | None  # the search's own objective: time per turn minus the defaults'
    turn_within_noise: bool | None


def _origin(search: Any) -> Setting:
    return getattr(search, "origin", DEFAULTS)  # a search stored before origins existed: the defaults


def _base_of(search: Any, knob: str) -> Setting:
    """The setting the knob's values were compared with (:meth:`xover.analysis.advise.Search.base_of`)."""
    return DEFAULTS if knob in getattr(search, "first", ()) else _origin(search)


def _against(search: Any) -> str:
    """What the rows after the configuration's own knobs compare with, in words."""
    if _origin(search) == DEFAULTS:
        return "the defaults"
    return next((t.label for t in search.trials if t.setting == _origin(search)), "the defaults") + " or the defaults"


def _trials_of(search: Any, knob: str, value: str) -> list[Any]:
    """The value's llama-bench processes: its trial, and its second when a marginal gain was measured again."""
    return [t for t in search.trials if t.varied == knob and dict(t.setting).get(knob) == value]


def knob_rows(search: Any, response: int, record: TuneRecord | None = None) -> list[KnobRow]:
    """One row per knob value the search tried (or skipped, or failed on, with why), then the recommendation: the
    tuned variant, unless its confirmation (in ``record``) failed."""

    rates = {}
    for base in {DEFAULTS, _origin(search)}:
        rates[base] = _trial_rates([t for t in search.trials if t.setting in (base, again(base))])

    def effect(trials: list[Any], value: str, base: Setting = DEFAULTS) -> Tradeoff | None:
        pp, tg = _trial_rates(trials)
        pp0, tg0 = rates[base]
        if not (pp and tg and pp0 and tg0):
            return None
        return tradeoff("defaults" if base == DEFAULTS else "origin", pp0, tg0, value, pp, tg, response)

    rows = []
    for v in search.verdicts:
        for e in v.effects:
            if v.no_effect:
                status = "no effect"
            elif v.kept == e.value:  # an own knob may move within the noise: each process beat each of the defaults'
                status = "kept" + (
                    ", within noise: each process faster than each of the defaults'" if e.within_noise else ""
                )
            else:
                status = "not kept" + (
                    " (within noise)" if e.within_noise else " (slower per turn)" if e.change_s > 0 else ""
                )
            if e.processes > 1:
                status += f" ({e.processes} processes)"
            rows.append(
                KnobRow(
                    v.knob,
                    e.value,
                    status,
                    effect(_trials_of(search, v.knob, e.value), e.value, _base_of(search, v.knob)),
                    e.change_s,
                    e.within_noise,
                )
            )
        rows += [
            KnobRow(v.knob, s, "not measured: llama.cpp runs it by default here", None, None, None) for s in v.skipped
        ]
        rows += [KnobRow(v.knob, f, _failed(search, v.knob, f), None, None, None) for f in v.failed]
    if search.recommended != DEFAULTS:
        best = next((t for t in search.trials if t.setting == search.recommended), None)
        if best is not None:
            rows.append(
                KnobRow(
                    "recommended",
                    best.label,
                    _recommended(record, search.recommended),
                    effect([best], best.label),
                    None,
                    None,
                )
            )
    return rows


def _failed(search: Any, knob: str, value: str) -> str:
    """A failed value's status: "failed", and why in one line (a retry hint where its process was interrupted)."""
    why = next((t.measurement.failure for t in _trials_of(search, knob, value) if t.measurement.failure), None)
    if not why:
        return "failed"
    return f"failed: {why}" + (f"; {RETRY_HINT}" if interrupted(why) else "")


def _recommended(record: TuneRecord | None, recommended: Setting) -> str:
    """The search's recommendation's status: the tuned variant, or why it is not (its confirmation failed, or the
    rounds of fresh processes kept less of it: told below the table)."""
    c = record.confirmation if record is not None else None
    failure = c.get("failure") if c is not None else None
    if not failure:
        if record is None or tuple(record.setting) == tuple(recommended):
            return "the tuned variant"
        if record.variant:
            return f"not kept whole: the tuned variant runs {record.setting_label} (the rounds below)"
        return "not kept: the rounds of fresh processes below kept the defaults"
    if interrupted(str(failure)):
        return f"not confirmed: the confirmation process was interrupted ({failure}); {RETRY_HINT}"
    return f"not confirmed: the confirmation failed ({failure})"


def _change(r: Ratio) -> str:
    return r.percent() + ("" if r.beyond_noise else " within noise")


def break_even_text(t: Tradeoff) -> str:
    """Where B's trade-off against A tips, in words (B: the changed setting)."""
    p, d = t.prefill.median, t.decode.median
    if t.break_even is None:
        if p >= 1 and d >= 1:
            return "no trade-off: not slower at either"
        if p <= 1 and d <= 1:
            return "no trade-off: not faster at either"
        return "no trade-off"
    side = "faster past" if p > 1 else "faster below"
    noisy = [name for name, r in (("prefill", t.prefill), ("decode", t.decode)) if not r.beyond_noise]
    tail = f" (the {' and '.join(noisy)} change is within noise)" if noisy else ""
    return f"{side} ~{format_tokens(t.break_even)} tokens{tail}"


def cached_change(search: Any, trial: Any | None, turns: Any) -> str:
    """A trial's expected time per cached turn (``turns``: a cached workload) against the defaults', from the same
    llama-bench tests the search measured (prefill integrated from the cached depth, decode past it), with the
    noise rule of the search's own verdicts."""

    against = _base_of(search, trial.varied) if trial is not None and trial.varied else DEFAULTS
    base = next((t for t in search.trials if t.setting == against), None)
    if trial is None or base is None or not trial.measurement.ok or not base.measurement.ok:
        return "—"
    a, b = estimate(trial.measurement, turns), estimate(base.measurement, turns)
    change = a.turn_s - b.turn_s
    return f"{change:+.3g} s" + (" (noise)" if abs(change) <= noise_between(a, b, search.drift_s) else "")


def knob_table(
    search: Any, response: int, turns: Any | None = None, record: TuneRecord | None = None
) -> tuple[list[str], list[list[str]]]:
    """The search's table; with ``turns`` (the study's cached agentic turns as a workload) each value is also
    scored per cached turn."""
    header = [
        "knob",
        "value",
        "prefill vs defaults",
        "decode vs defaults",
        "time per turn vs defaults (search)",
        *([f"per cached turn ({turns.name}) vs defaults"] if turns is not None else []),
        "verdict",
        f"break-even ({response}-token responses{'; prompt or new tokens a turn' if turns is not None else ''})",
    ]
    rows = []
    for r in knob_rows(search, response, record):
        cached = (
            [cached_change(search, next(iter(_trials_of(search, r.knob, r.value)), None) if r.effect else None, turns)]
            if turns is not None
            else []
        )
        turn = (
            "—"
            if r.turn_change_s is None
            else f"{r.turn_change_s:+.3g} s" + (" (noise)" if r.turn_within_noise else "")
        )
        if r.effect is None:
            rows.append([r.knob, r.value, "—", "—", turn, *cached, r.status, "—"])
            continue
        rows.append(
            [
                r.knob,
                r.value,
                _change(r.effect.prefill),
                _change(r.effect.decode),
                turn,
                *cached,
                r.status,
                break_even_text(r.effect),
            ]
        )
    return header, rows


# ---- the serving path decides ---------------------------------------------------------------------


def _bench_pp(bench: Sequence[tuple[str, BenchResult]]) -> dict[tuple[str, int], list[float]]:
    """llama-bench prefill samples per (label, depth): the latest pp test stored there."""
    out: dict[tuple[str, int], list[float]] = {}
    for label, r in bench:
        if r.n_prompt and not r.n_gen and r.samples_ts:
            out[(label, r.n_depth)] = list(r.samples_ts)
    return out


def _ttft_speed(cold: Sequence[tuple[str, TtftSample]]) -> dict[tuple[str, int], list[float]]:
    """Prefill speed seen through llama-server per (label, length): L / cold TTFT, tokens/s."""
    out: dict[tuple[str, int], list[float]] = defaultdict(list)
    for label, s in cold:
        if s.first_token_ns:
            out[(label, s.length)].append(s.length / (s.first_token_ns / 1e9))
    return dict(out)


@dataclasses.dataclass(frozen=True)
class ServedRow:
    length: int
    bench: Ratio | None  # llama-bench pp @ dL, tuned over defaults
    served: Ratio | None  # L / cold TTFT, tuned over defaults

    @property
    def not_seen(self) -> bool:
        """llama-bench gains beyond noise, llama-server's TTFT does not (or by less than half as much)."""
        if self.bench is None or self.served is None or self.bench.direction <= 0:
            return False
        return self.served.direction <= 0 or (self.served.median - 1) < GAIN_SHOWN * (self.bench.median - 1)


def served_rows(
    base: str, variant: str, bench: Sequence[tuple[str, BenchResult]], cold: Sequence[tuple[str, TtftSample]]
) -> list[ServedRow]:
    pp, tt = _bench_pp(bench), _ttft_speed(cold)
    lengths = sorted({L for lb, L in (*pp, *tt) if lb in (base, variant)})
    out = []
    for L in lengths:
        b = ratio(pp[(base, L)], pp[(variant, L)]) if (base, L) in pp and (variant, L) in pp else None
        s = ratio(tt[(base, L)], tt[(variant, L)]) if (base, L) in tt and (variant, L) in tt else None
        if b is not None or s is not None:
            out.append(ServedRow(L, b, s))
    return out


def served_table(rows: Sequence[ServedRow]) -> tuple[list[str], list[list[str]]]:
    header = [
        "prompt / depth",
        "llama-bench prefill (pp @ dL), tuned vs defaults",
        "cold TTFT prefill (L / TTFT), tuned vs defaults",
        "finding",
    ]
    out = []
    for r in rows:
        finding = "llama-bench gain not seen through llama-server" if r.not_seen else ""
        out.append(
            [
                format_tokens(r.length),
                _change(r.bench) if r.bench else "—",
                _change(r.served) if r.served else "—",
                finding,
            ]
        )
    return header, out


def tradeoff_table(t: ServedTradeoff) -> tuple[list[str], list[list[str]]]:
    header = [
        "prompt",
        "prefill (L / TTFT), tuned vs defaults",
        "decode (llama-server's; llama-bench tg where it reported none), tuned vs defaults",
        f"total per turn: defaults → tuned ({t.response}-token responses)",
        "faster per turn",
        "break-even at these rates",
    ]
    rows = []
    for p in t.points:
        faster = {-1: t.a, 1: t.b}.get(p.separated, "within noise")
        rows.append(
            [
                format_tokens(p.length),
                _change(p.tradeoff.prefill),
                _change(p.tradeoff.decode),
                f"{p.total_a_s:.2f} s → {p.total_b_s:.2f} s",
                faster,
                break_even_text(p.tradeoff),
            ]
        )
    return header, rows


# ---- the section ----------------------------------------------------------------------------------


def _rounds_text(c: Mapping[str, Any], decode: bool, named: bool = False) -> str:
    """How a setting fared in rounds of fresh llama-bench processes (a stored confirmation): the search's
    recommendation against the defaults (or against its origin: the configuration's own knobs as the search moved
    them), or decode's own best setting (``decode``) against the recommendation. A confirmation against an origin,
    and (``named``) the origin's own, begin with the setting they weighed."""
    origin = pairs_label(c.get("against") or ())
    against = "the defaults" if not origin else "the tuned setting" if decode else origin
    whose = possessive(against)
    cached = c.get("part") == "cached"
    kind = "cached turns" if cached else "decode"
    outcome = (
        f"no variant tuned for {kind}"
        if decode
        else f"what it adds to {origin} was not kept"
        if origin
        else "the defaults were kept"
    )
    weighed = pairs_label(c.get("setting") or ()) + ": " if not decode and (origin or named) else ""
    if c.get("failure"):  # named where a record may hold two confirmations: which one failed
        return f"{weighed}The confirmation in rounds failed ({c['failure']}): {outcome}."
    ratio, low, high, n = c.get("ratio"), c.get("low"), c.get("high"), c.get("n") or 0
    told = "; ".join(
        f"round {k}: {d:.3f} s vs {t:.3f} s"
        for k, d, t in c.get("rounds") or []
        if isinstance(d, (int, float)) and isinstance(t, (int, float))
    )
    # stopped before the most rounds allowed: no result of the rounds left could have put the interval below 1
    stopped = (
        f" Stopped after {len(c.get('rounds') or [])} of at most {c['stopped']} rounds: whatever the rounds left"
        " measured, the interval could not have fallen below 1."
        if c.get("stopped")
        else ""
    )
    if ratio is None:
        if stopped and told:
            return (
                f"{weighed}Not confirmed in rounds of fresh llama-bench processes, interleaved with {against} "
                f"({told}): {outcome}.{stopped}"
            )
        return f"{weighed}Too few rounds to confirm it: {outcome}."
    what = "decode time" if decode and not cached else "time"
    span = f"{ratio:.2f}x {whose} {what} per {'cached turn' if cached else 'turn'} (95% interval {low:.2f}-{high:.2f}, {n} rounds: {told})"
    if c.get("kept"):
        return f"{weighed}Confirmed in rounds of fresh llama-bench processes, interleaved with {against}: {span}."
    verdict_ = (
        f"the interval lies above 1, so it is slower than {against} here"
        if isinstance(low, (int, float)) and low > 1 and n >= MIN_ROUNDS
        else f"the interval includes 1, so it is indistinguishable from {against} here"
    )
    return (
        f"{weighed}Not confirmed in rounds of fresh llama-bench processes, interleaved with {against}: {span}; "
        f"{verdict_}: {outcome}.{stopped}"
    )


def _decode_blocks(r: TuneRecord) -> list[Block]:
    """The variant tuned for decode-heavy turns (or why there is none though decode's best setting differed)."""
    c = r.decode_confirmation
    if c is None:
        return []
    label = pairs_label(c.get("setting") or ())
    cached = c.get("part") == "cached"
    whose = "The cached turns' own best setting" if cached else "Decode's own best setting"
    if r.decode_variant is None:
        return [Block("p", f"{whose} ({label or 'the defaults'}): " + _rounds_text(c, decode=True))]
    cross = (
        "the verdicts on cached turns say which to run for which turn size, and where they cross in new tokens"
        if cached
        else "The verdicts say which to run for which kind of turn, and the prompt length where they cross"
    )
    return [
        Block("h3", f"{r.config} → {r.decode_variant}: {r.decode_setting_label}"),
        Block(
            "p",
            f"{whose} differs from the whole turn's: {r.decode_variant} runs {r.config} with "
            f"{r.decode_setting_label}, and was measured through the whole study beside {r.variant or r.config}"
            + (" (scored on the study's cached agentic turns from the search's llama-bench tests)" if cached else "")
            + f". {cross[0].upper() + cross[1:]}. "
            + _rounds_text(c, decode=True),
        ),
        *(
            [Block("code", r.decode_server_command), *_kv_note(r.decode_server_command)]
            if r.decode_server_command
            else []
        ),
    ]


KV_QUALITY_NOTE = (
    "This line quantizes the KV cache (-ctk/-ctv): xover measured its speed and the experts the freed VRAM keeps on "
    "the GPU, not its quality cost. Check your model's answers with it before you adopt it."
)


def _kv_note(command: str) -> list[Block]:
    """The quality note under a command line that quantizes the KV cache."""
    flags = {*opts.CACHE_TYPE_K.server, *opts.CACHE_TYPE_V.server}
    return [Block("p", KV_QUALITY_NOTE)] if flags.intersection(command.split()) else []


def _record_blocks(r: TuneRecord, response: int, turns: Any | None = None, engine: str = opts.ENGINE) -> list[Block]:
    origin = r.origin_confirmation
    origin_blocks = [Block("p", _rounds_text(origin, decode=False, named=True))] if origin is not None else []
    if r.variant is None:
        out = [
            Block("h3", f"{r.config}: {engine}'s defaults kept"),
            Block(
                "p",
                _rounds_text(r.confirmation, decode=False)
                if r.confirmation is not None
                else "No knob value beat the defaults by more than the noise, so nothing was measured twice.",
            ),
            *origin_blocks,
        ]
    else:
        out = [
            Block("h3", f"{r.config} → {r.variant}: {r.setting_label}"),
            Block(
                "p",
                f"The tuned variant {r.variant} runs {r.config} with {r.setting_label}"
                + (f" and {', '.join(f'{k}={v}' for k, v in r.env)} in the environment" if r.env else "")
                + "; it was measured through the whole study like any configuration.",
            ),
        ]
        if r.confirmation is not None:
            out.append(Block("p", _rounds_text(r.confirmation, decode=False)))
        out += origin_blocks
        if not origin_blocks and r.same_as is not None:
            out.append(
                Block(
                    "p",
                    f"It runs the command of {r.same_as}, another configuration of this study, which the rounds of "
                    f"fresh servers below measure beside {r.config}: those rounds are its confirmation, so no "
                    "llama-bench rounds compared it with the defaults here.",
                )
            )
    if r.server_command:
        out += [Block("code", r.server_command), *_kv_note(r.server_command)]
    out += _decode_blocks(r)
    if r.skipped:
        out.append(Block("p", "Not searched here: " + "; ".join(f"{knob}: {why}" for knob, why in r.skipped) + "."))
    if r.note and r.search is not None:
        out.append(Block("p", r.note))
    where = [f"workload {r.workload}"] if r.workload else []
    if r.depths:
        where.append(f"llama-bench pp{r.chunk or ''} and tg at depths {', '.join(format_tokens(d) for d in r.depths)}")
    if r.depths_left_out:
        left = ", ".join(f"{format_tokens(d)} (about {s / 60:.1f} min more)" for d, s in r.depths_left_out)
        where.append(
            f"left out depth {left}, past the search's share of the study's budget: its scores rest on the rates "
            "at the depths measured"
        )
    if where:
        out.append(Block("p", "Search: " + "; ".join(where) + "."))
    if r.search is None:
        out.append(Block("p", r.note or "The search itself was not stored."))
        return out
    if _origin(r.search) != DEFAULTS:
        moved = next(
            (t.label for t in r.search.trials if t.setting == _origin(r.search)), pairs_label(_origin(r.search))
        )
        kept = [e for v in r.search.verdicts if v.knob in r.search.first for e in v.effects if e.value == v.kept]
        how = (
            "won each of its two processes against each of the defaults' (within the noise of the two sides' "
            "spreads added: the confirmation decides)"
            if any(e.within_noise for e in kept)
            else "won beyond the noise"
        )
        out.append(
            Block(
                "p",
                f"{r.config} sets {', '.join(r.search.first)} itself, so "
                f"{'it was' if len(r.search.first) == 1 else 'they were'} searched first: {moved} {how}, and every "
                f"other knob was measured on top of {moved}; their rows compare with {moved}, not with the defaults."
                + (
                    f" {moved} runs the command of {r.origin_same_as}, another configuration of this study: its gain "
                    f"over {r.config}'s own setting rests on the rounds of fresh servers below, which measure the two "
                    f"side by side; the llama-bench rounds confirmed only what {r.variant} adds to it."
                    if r.origin_same_as is not None and r.variant is not None
                    else ""
                ),
            )
        )
    out.append(table(*knob_table(r.search, response, turns, r)))
    no_effect = [v.knob for v in r.search.verdicts if v.no_effect]
    if no_effect:
        out.append(
            Block(
                "p",
                f"No effect on this hardware (every value within noise of {_against(r.search)}): "
                f"{', '.join(no_effect)}.",
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class Measured:
    """What the served comparison reads: the crossover inputs per label, llama-bench's results and the cold
    TTFT samples, with the turn's response length and the agentic band."""

    configs: Mapping[str, ConfigData]
    bench: Sequence[tuple[str, BenchResult]]
    cold: Sequence[tuple[str, TtftSample]]
    response: int
    band: tuple[int, int]
    turns: Any | None = None  # the study's cached agentic turns as an advise workload (None: none measured)
    engines: Mapping[str, str] = dataclasses.field(default_factory=dict)  # label -> its engine (default llama.cpp)


def _served_blocks(base: str, variant: str, m: Measured) -> list[Block]:
    configs, bench, cold, response, band = m.configs, m.bench, m.cold, m.response, m.band
    out = [Block("h3", f"{base}: defaults vs {variant} through llama-server")]
    rows = served_rows(base, variant, bench, cold)
    if rows:
        unseen = [format_tokens(r.length) for r in rows if r.not_seen]
        if unseen:
            out.append(
                Block(
                    "p",
                    f"llama-bench gain not seen through llama-server at {', '.join(unseen)}: llama-bench "
                    "prefills on top of a cached depth, llama-server's cold TTFT prefills the whole prompt "
                    "(and pays HTTP, tokenization and the last partial ubatch).",
                )
            )
        out.append(table(*served_table(rows)))
    if base in configs and variant in configs and set(configs[base].ttft_s) & set(configs[variant].ttft_s):
        t = served_tradeoff(configs[base], configs[variant], response)
        out.append(Block("p", verdict(t.pair, band)))
        out.append(table(*tradeoff_table(t)))
    else:
        out.append(Block("p", "No cold TTFT with server decode for both yet: no served trade-off to show."))
    return out


def blocks(lay: Layout, m: Measured) -> list[Block]:
    """The Tuning section (empty when the study stored no tuning)."""
    if not lay.records:
        return []
    out = [
        Block("h2", "Tuning: llama.cpp settings per configuration"),
        Block(
            "p",
            "Each configuration's knobs were searched one at a time from llama.cpp's defaults with llama-bench "
            "(xover advise's coordinate search). Prefill and decode changes are kept apart: each is the "
            "median ratio against the defaults with its range [min..max] over repetitions, pooled over the "
            "measured depths (each repetition's tokens over its time across the depths' tests); the defaults "
            "pool both of their measurements, so drift between them counts as noise; within noise means the "
            "repetitions' ranges overlap. The break-even is the prompt length past which a prefill gain "
            "outweighs a decode loss (or the reverse) at constant rates.",
        ),
    ]
    for r in lay.records:
        out += _record_blocks(r, m.response, m.turns, m.engines.get(r.config, opts.ENGINE))
    served = [(r.config, r.variant) for r in lay.records if r.variant]
    if served:
        out.append(Block("h2", "The serving path decides: llama-bench's gain through llama-server"))
        out.append(
            Block(
                "p",
                "Tuned against defaults per length: llama-bench's prefill at depth L beside the cold "
                "TTFT through llama-server, then the served trade-off (prefill from TTFT, the server's "
                "decode) and who is faster per turn.",
            )
        )
        for base, variant in served:
            assert variant is not None
            out += _served_blocks(base, variant, m)
    return out


def section_markdown(bl: Sequence[Block]) -> str:
    return blocks_markdown(bl)


def section_html(bl: Sequence[Block]) -> str:
    return "\n".join(blocks_html(bl))
