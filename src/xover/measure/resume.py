"""What a study still has to measure, from its store alone: the plan every stage of ``xover study`` follows on a
rerun. Pure: it reads a :class:`xover.results.read_model.StudyData`.

A study is resumed configuration by configuration: a configuration's key (:attr:`xover.domain.config.LlamaConfig.key`)
is what it asks of llama.cpp, so whatever was stored under it, from any directory, counts. ``fit`` levels are placed
by the planner and take llama.cpp's stored word on them when the planned levels are the ones it checked; tuned
variants come from the stored tuning results of unchanged configurations.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from xover.analysis.crossover import ConfigData
from xover.domain.artifacts import TTFT_EFFICIENCY, TUNED
from xover.domain.config import LlamaConfig
from xover.domain.records import TtftSample
from xover.domain.study_spec import StudySpec
from xover.domain.turn_kinds import AFTER_COLD, COLD, TurnKind, by_name
from xover.measure import fit, tune
from xover.measure.ttft import linear_estimate
from xover.results.read_model import StoredSample, StudyData


def _counted(
    stored: Sequence[StoredSample], model_key: str, config_key: str, round: int | None | bool = True, mode: str = "cold"
) -> list[TtftSample]:
    """One configuration's stored samples that count, cold (:attr:`TtftSample.counted_cold`) or of another kind's
    ``mode`` (a cached turn's ``cached:<depth>``, ``chat``; counted and not a drift check): of round ``round`` (None: those measured before rounds), or of
    every round (True)."""
    return [
        row.sample
        for row in stored
        if row.sample.config_key == config_key
        and row.model_key == model_key
        and (
            row.sample.counted_cold
            if mode == "cold"
            else row.sample.mode == mode and row.sample.counted and not row.sample.drift_check
        )
        and (round is True or row.sample.round == round)
    ]


def _over_cap(
    sizes: Sequence[int], medians: Mapping[int, float], cap: float | None, inclusive: bool = False
) -> dict[int, tuple[float, int]]:
    """The sizes the stored cold medians already estimate over the max-ttft ``cap`` (:func:`linear_estimate`), each
    with its estimate and the length it was scaled from."""
    if cap is None:
        return {}
    out = {}
    for n in sizes:
        est = linear_estimate(n, medians, inclusive)
        if est is not None and est[0] > cap:
            out[n] = est
    return out


def missing_ttft(
    stored: Sequence[StoredSample],
    spec: StudySpec,
    model_key: str,
    config_key: str,
    fresh: bool,
    lengths: Sequence[int] | None = None,
    round: int | None = None,
) -> dict[int, int]:
    """Prompt length -> counted cold samples still needed for one configuration (its key) in round ``round`` (None:
    among those measured before rounds), given the study's stored samples (the read model's ``ttft_rows``), among
    ``lengths`` (default: the study's). ``spec.repetitions`` samples a length make a round complete."""
    lengths = spec.lengths if lengths is None else lengths
    have = Counter(s.length for s in ([] if fresh else _counted(stored, model_key, config_key, round)))
    return {L: spec.repetitions - have[L] for L in lengths if have[L] < spec.repetitions}


def stored_medians(stored: Sequence[StoredSample], model_key: str, config_key: str) -> dict[int, float]:
    """Length -> median cold TTFT (s) of one configuration's counted cold samples (every round)."""
    by_length: dict[int, list[float]] = {}
    for s in _counted(stored, model_key, config_key):
        if s.first_token_ns is not None:
            by_length.setdefault(s.length, []).append(s.first_token_ns / 1e9)
    return {L: statistics.median(v) for L, v in by_length.items()}


def last_round(stored: Sequence[StoredSample]) -> int:
    """The last round any cold sample was stored in (0: none)."""
    return max((abs(row.sample.round) for row in stored if row.sample.round is not None), default=0)


def rounds_of_other_sessions(data: StudyData, model_key: str, current: str | None) -> frozenset[int]:
    """The rounds of fresh servers (of ``model_key``) begun in another session of the machine than ``current`` (its
    boot id, :func:`xover.measure.provenance.boot_id`): a resume leaves them as they are. A round pairs processes
    measured close together on one machine; one that a lease left unfinished and the next lease completes pairs
    another host's processes (seen on two H100 hosts, 1.4-1.6x apart where experts ran on the CPU), so its missing
    samples are measured in later rounds instead, where the open questions ask for them. A run stored without a boot
    id (an older xover) counts as another session; with ``current`` None (no boot id here) nothing is closed."""
    if current is None:
        return frozenset()
    sessions = data.run_sessions()
    return frozenset(
        row.sample.round
        for row in data.ttft_rows
        if row.model_key == model_key
        and row.sample.round is not None
        and row.sample.round > 0
        and sessions.get(row.run_id) != current
    )


def lacking(
    todo: Sequence[TtftTodo], inputs: Mapping[str, Sequence[ConfigData]], cold: str, need: int
) -> frozenset[tuple[str, int]]:
    """The points, (kind of turn by name, tokens), that some configuration of ``todo`` would measure in a new round
    and has fewer than ``need`` rounds of (``inputs``: each kind's per-round inputs, by kind name; ``cold``: the
    kind of ``TtftTodo.missing``). After rounds left to another session (:func:`rounds_of_other_sessions`) these are
    measured in the rounds past the study's first ones, with every configuration at them, so that they pair on
    one host: a configuration added since, one that failed there, a length or turn size new to the spec."""
    have = {
        (kind, c.label, n): len(by_round) for kind, configs in inputs.items() for c in configs
        for n, by_round in c.rounds.items()
    }  # fmt: skip
    out: set[tuple[str, int]] = set()
    for t in todo:
        wanted = [(cold, n) for n in t.missing] + [(k, n) for k, sizes in t.turns.items() for n in sizes]
        out.update(p for p in wanted if have.get((p[0], t.config.name, p[1]), 0) < need)
    return frozenset(out)


def round_cost(spec: StudySpec, data: StudyData, todo: Sequence[TtftTodo], model_key: str) -> float | None:
    """The seconds a round of ``todo`` (each configuration's server and the samples it would measure) is expected to
    take, from what the study stored of ``model_key``. Per configuration: its latest server's load and overhead (its
    wall time less its load and its requests: the warm-up and the stop, and a cached turn's priming where it measured
    one); each sample's median stored request time (sent to done) at its point; and, where it measures cached turns,
    their priming as a cold request at the cached depth (the nearest stored cold length at or above it). None where a
    configuration has no stored server, or a point no stored request: the caller's last round stands in. A round
    past the first ones measures only the open questions' points, which the last round's wall overstates (lease 6
    of studies/h200-backends, on its own store: its rounds of open questions 107-212 s predicted against 102-182 s
    taken, its whole rounds 277-319 s against 278-320 s)."""
    models = {r.id: r.provenance.model.key if r.provenance.model else None for r in data.runs}
    load: dict[str, float] = {}  # configuration key -> its latest server's load (s)
    overhead: dict[str, float] = {}  # -> the same server's overhead (s)
    for a in data.artifacts:  # oldest first
        b = a.body
        if a.name == TTFT_EFFICIENCY and models.get(a.run_id or -1) == model_key and isinstance(b, dict):
            if b.get("load_s") is not None:
                load[b["config_key"]] = b["load_s"]
                overhead[b["config_key"]] = max(0.0, b["wall_s"] - b["load_s"] - (b.get("requests_s") or 0.0))
    seconds: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for row in data.ttft_rows:
        s = row.sample
        if row.model_key == model_key and s.counted and s.end_ns:
            seconds[(s.config_key, s.mode, s.length)].append(s.end_ns / 1e9)
    total = 0.0
    for t in (t for t in todo if t.anything):
        key = t.config.key
        if key not in load:
            return None
        total += load[key] + overhead[key]
        points = [(COLD.mode(0), n, k) for n, k in t.missing.items()]
        for kind, sizes in ((by_name(name), sizes) for name, sizes in t.turns.items() if any(sizes.values())):
            depth = kind.depth(spec) or 0
            points += [(kind.mode(depth), n, k) for n, k in sizes.items()]
            cold = sorted(n for (k, m, n) in seconds if k == key and m == COLD.mode(0))
            if cold and depth:  # the priming request: a cold prompt of the cached depth
                points.append((COLD.mode(0), next((n for n in cold if n >= depth), cold[-1]), 1))
        for mode, n, k in points:
            measured = seconds.get((key, mode, n))
            if not measured:
                return None
            total += k * statistics.median(measured)
    return total


def distinct(spec: StudySpec) -> tuple[StudySpec, tuple[tuple[str, str], ...]]:
    """``spec`` with each configuration measured once: a configuration that asks llama.cpp the same as an earlier
    one (the same key: a fit level placed where another configuration already is, a tuned variant equal to another
    configuration) is left out, its name mapped to the earlier one's in the headline pairs, the context it is
    placed for the longer of the two; and each name left out with the name it is measured as."""
    kept: dict[str, LlamaConfig] = {}
    alias: dict[str, str] = {}
    for c in spec.configs:
        first = kept.setdefault(c.key, c)
        if first is not c:
            alias[c.name] = first.name
            if first.max_context is not None and (c.max_context is None or c.max_context > first.max_context):
                kept[c.key] = dataclasses.replace(first, max_context=c.max_context)  # measured where either holds
    if not alias:
        return spec, ()
    pairs = tuple((alias.get(a, a), alias.get(b, b)) for a, b in spec.pairs)
    configs = tuple(kept.values())
    return dataclasses.replace(spec, configs=configs, pairs=tuple(p for p in pairs if p[0] != p[1])), tuple(
        alias.items()
    )


@dataclasses.dataclass(frozen=True)
class TtftTodo:
    """One configuration's cold TTFT still to measure: samples per length, its stored medians (for the max-ttft
    cap), and why lengths are left out (placed for a shorter context, or estimated over the cap)."""

    config: LlamaConfig
    missing: dict[int, int]
    medians: dict[int, float]
    notes: tuple[str, ...]
    # per kind of turn measured after the cold samples (domain.turn_kinds.AFTER_COLD, by name): tokens per turn ->
    # samples needed
    turns: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)

    @property
    def anything(self) -> bool:
        return bool(self.missing or any(self.turns.values()))


def ttft_todo(
    spec: StudySpec, stored: Sequence[StoredSample], model_key: str, round: int, fresh: bool = False
) -> list[TtftTodo]:
    """Per configuration of ``spec``: the cold samples round ``round`` still needs (every configuration, also those
    complete). A configuration whose every length has its samples from before rounds (one server process) is
    complete, unless ``fresh``: its stored results keep their verdicts, labelled as such. Lengths the stored samples
    already estimate over the study's max-ttft are left out."""
    out = []
    for c in spec.configs:
        notes = []
        lengths = spec.lengths_for(c)
        if len(lengths) < len(spec.lengths):
            beyond = ", ".join(f"{L:,}" for L in spec.lengths if L not in lengths)
            notes.append(f"{c.name}: placed for {c.max_context:,} tokens; not at {beyond}")
        medians = stored_medians(stored, model_key, c.key)
        cap = spec.max_ttft_s
        # lengths the stored samples already put over the cap
        for L, est in _over_cap(sorted(set(lengths) - set(medians)), medians, cap).items():
            lengths = tuple(x for x in lengths if x != L)
            notes.append(
                f"{c.name} L={L:,}: not measured, about {est[0]:.0f} s by the stored {est[1]:,}-token "
                f"samples, over max-ttft {cap:.0f} s"
            )
        turns = {k.name: missing_turns(stored, spec, k, model_key, c, round, fresh) for k in AFTER_COLD}
        # turns whose new tokens alone the cold samples put over the cap
        for kind in AFTER_COLD:
            for n, est in _over_cap(sorted(turns[kind.name]), medians, cap, inclusive=True).items():
                del turns[kind.name][n]
                notes.append(
                    f"{c.name}: {kind.name} turns of {n:,} new tokens not measured, their prefill alone about "
                    f"{est[0]:.0f} s by the stored {est[1]:,}-token cold samples, over max-ttft {cap:.0f} s"
                )
        if not fresh and not missing_ttft(stored, spec, model_key, c.key, False, lengths, round=None):
            out.append(TtftTodo(c, {}, medians, tuple(notes), turns))  # measured before rounds, complete
            continue
        missing = missing_ttft(stored, spec, model_key, c.key, False, lengths, round=round)
        out.append(TtftTodo(c, missing, medians, tuple(notes), turns))
    return out


def missing_turns(
    stored: Sequence[StoredSample],
    spec: StudySpec,
    kind: TurnKind,
    model_key: str,
    config: LlamaConfig,
    round: int,
    fresh: bool,
) -> dict[int, int]:
    """Tokens per turn -> samples of ``kind`` still needed by ``config`` in round ``round`` (``spec.repetitions``
    each, at the kind's depth)."""
    depth = kind.depth(spec)
    if depth is None:
        return {}
    have = Counter(
        s.length for s in ([] if fresh else _counted(stored, model_key, config.key, round, kind.mode(depth)))
    )
    return {n: spec.repetitions - have[n] for n in kind.wanted(spec, config) if have[n] < spec.repetitions}


def bench_todo(spec: StudySpec, data: StudyData, model_key: str, fresh: bool) -> dict[str, int]:
    """Configuration name -> llama-bench tests still to measure (pp and tg at each of its depths)."""
    have = (
        set()
        if fresh
        else {
            (r.result.config_key, r.result.n_prompt, r.result.n_gen, r.result.n_depth)
            for r in data.bench_rows
            if r.model_key == model_key
        }
    )
    out = {}
    for c in spec.configs:
        depths = spec.bench_depths_for(c)
        wanted = [(spec.pp, 0, d) for d in depths] + [(0, spec.tg, d) for d in depths]
        missing = [p for p in wanted if (c.key, *p) not in have]
        if missing:
            out[c.name] = len(missing)
    return out


def stored_checks(data: StudyData, records: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]] | None:
    """llama.cpp's stored word on the planner's levels (artifact ``fit-check{suffix}``) when it checked exactly
    these levels, else None (the check must run)."""
    checked = data.fit_records(suffix, checked=True)
    planned = [(r["config"], r["n_cpu_moe"], r["n_ctx"]) for r in records]
    if checked is not None and [(c.config, c.n_cpu_moe, c.n_ctx) for c in checked] == planned:
        return [dict(c.body) for c in checked]
    return None


@dataclasses.dataclass(frozen=True)
class Pending:
    """What a resumed study would measure. Empty everywhere: nothing (the report rebuilds from the store)."""

    fit_checks: tuple[str, ...]  # configurations whose llama.cpp check of a planned level would run
    tune: tuple[str, ...]  # configurations the tuning stage would search
    bench: dict[str, int]  # configuration -> llama-bench tests
    ttft: dict[str, int]  # configuration -> cold TTFT samples and cached turns
    configs: tuple[LlamaConfig, ...]  # every configuration measured, placed, tuned variants included

    @property
    def nothing(self) -> bool:
        return not (self.fit_checks or self.tune or self.bench or self.ttft)

    def describe(self) -> list[str]:
        if self.nothing:
            return ["nothing to measure: every configuration's results are stored"]
        out = [f"llama.cpp's check of the planned level of {c}" for c in self.fit_checks]
        out += [f"the tuning search of {c}" for c in self.tune]
        out += [f"{c}: {n} llama-bench tests" for c, n in self.bench.items()]
        out += [f"{c}: {n} cold TTFT samples and cached turns" for c, n in self.ttft.items()]
        return out


def pending(spec: StudySpec, data: StudyData, terms: Any, model_key: str) -> Pending:
    """What ``xover study`` would measure on ``data``'s study: the stages' own plan (``terms``: the model's
    :class:`xover.analysis.theory.ModelTerms`, for the placement planner; the model's key in the store)."""

    fit_checks: list[str] = []
    if fit.has_fits(spec):
        spec, records = fit.resolve_fits(spec, terms)
        checks = stored_checks(data, records, "")
        if checks is None:
            fit_checks += [r["config"] for r in records]
        else:
            spec = dataclasses.replace(spec, configs=fit.apply_checks(spec.configs, checks))
    else:
        records = []
    spec, _ = distinct(spec)
    found = tune.stored(data, spec.configs)
    to_tune = (
        tuple(c.name for c in spec.configs if c.name not in found) if spec.tune and "tune" not in spec.skip else ()
    )
    variants = tune.variants(found[c.name] for c in spec.configs if c.name in found)
    if records:
        variants, refits = fit.refit_variants(spec, terms, records, variants)
        checks = stored_checks(data, refits, TUNED) if refits else []
        if checks is None:
            fit_checks += [r["config"] for r in refits]
        else:
            variants = fit.apply_checks(variants, checks)
    measured, _ = distinct(dataclasses.replace(spec, configs=spec.configs + variants))
    benched = measured
    if records:  # tuned variants placed by their server below llama-bench's level are not benched
        skipped = fit.not_benched(data.fit_records(TUNED, checked=True) or ())
        benched = dataclasses.replace(measured, configs=tuple(c for c in measured.configs if c.name not in skipped))
    bench = {} if "bench" in spec.skip else bench_todo(benched, data, model_key, fresh=False)
    ttft: dict[str, int] = {}
    if (
        "ttft" not in spec.skip
    ):  # the rounds every configuration needs at least (more are added where a question is open)
        for n in range(1, spec.rounds + 1):
            for t in ttft_todo(measured, data.ttft_rows, model_key, n):
                ttft[t.config.name] = (
                    ttft.get(t.config.name, 0)
                    + sum(t.missing.values())
                    + sum(sum(v.values()) for v in t.turns.values())
                )
    return Pending(tuple(fit_checks), to_tune, bench, {k: v for k, v in ttft.items() if v}, measured.configs)
