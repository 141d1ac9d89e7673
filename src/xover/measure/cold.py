"""The study's cold TTFT stage, in rounds of fresh servers: the process is the unit of evidence.

Round after round, every configuration's llama-server is started afresh, answers a discarded warm-up request and
then ``repetitions`` cold requests at each prompt length (each proven cold: ``cache_n == 0``); the order of the
configurations alternates between rounds (:func:`xover.analysis.rounds.order`), so slow drift of the machine falls
on every configuration alike. After the study's ``rounds``, rounds are added only for the configurations of a
question still open (a verdict pair whose ratio's interval straddles 1 at some length, or a fastest configuration
not yet separated from another), up to ``max-rounds`` and while the study's ``budget`` lasts. At the end the first
configuration is measured once more in a fresh server (a drift check: its samples are kept apart, round ``-R``),
so the report can say when the machine moved during the stage.

Every sample is stored with its round the moment it is measured, and each server's load time, wall time and the
machine's busy and stolen CPU share over its life (artifact ``ttft-efficiency``); a rerun resumes round by round.
A configuration whose server fails (it cannot load, never becomes healthy, dies mid-request) is recorded and left
out of the stage's later rounds; the next run retries it.
A configuration measured completely before rounds existed (one server process) keeps its stored samples and
verdicts; ``--fresh`` measures it again in rounds after everything stored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Mapping, Sequence

from xover.analysis.crossover import open_questions
from xover.analysis.rounds import order, rotated
from xover.domain.artifacts import TTFT_EFFICIENCY, SkippedPoint
from xover.domain.config import LlamaConfig
from xover.domain.llama_options import BACKEND_TRAITS, build_name
from xover.domain.study_spec import StudySpec
from xover.domain.turn_kinds import AFTER_COLD, COLD, TURN_KINDS
from xover.llamacpp.server import ServerLaunch, buffer_log_verbosity, context_size
from xover.measure import ttft as ttftrun
from xover.measure.context import StageEvent, Study, server_timeout
from xover.measure.events import ConfigFailed, Rerun, SampleDone, ServerUp
from xover.measure.provenance import boot_id, cpu_shares, model_id, proc_stat
from xover.measure.resume import TtftTodo, lacking, last_round, round_cost, rounds_of_other_sessions, ttft_todo
from xover.results.read_model import TURN_INPUTS, StudyData, load_if_any
from xover.results.store import Store


def _lazy_pipelines(backend: str) -> bool:
    traits = BACKEND_TRAITS.get(backend)
    return traits is not None and traits.lazy_pipelines


class _Rounds:
    """The stage's servers: one per configuration and round, each storing its samples with the round."""

    def __init__(self, st: Study) -> None:
        self.st = st
        self.mk = model_id(st.model).key
        self.ctx = context_size(st.spec.longest_context_need, max(st.spec.response_tokens))
        self.failures = 0
        self.done = 0
        self.failed: set[str] = set()  # configurations whose server failed: no more rounds in this run
        self.walls: dict[str, float] = {}  # each configuration's last server, start to stop (s)
        # log level 4: the load log then names every buffer (CPU_Mapped, CUDA_Host, CPU_REPACK...) and its size
        self.verbosity = buffer_log_verbosity(st.binaries.server)

    def prewarm(self, configs: Sequence[LlamaConfig]) -> None:
        """The first server of each lazy-pipeline build among ``configs`` (in the order given), started, warmed and
        stopped once before this run's first round, nothing stored. Such a backend (Vulkan) compiles its pipelines
        through the driver, whose shader cache then serves later processes on the machine: the first server pays
        what later ones do not (on the H100, Vulkan's first server took 17-18 s to warm up and its first 1K prompt
        near 2x later rounds'), and no configuration's first round should carry it. Other backends' first-process
        costs (the model's pages, the first large batch) are paid by each server's own warm-up prompts."""
        st = self.st
        lazy = [c for c in configs if (b := st.binaries.for_config(c).expected_backend) and _lazy_pipelines(b)]
        firsts = {c.build: c for c in reversed(lazy)}
        for c in (c for c in lazy if firsts.get(c.build) is c):
            st.emit(
                StageEvent("ttft", "info", f"warming {build_name(*c.build)}'s first server (not measured): {c.name}")
            )
            launch = ServerLaunch(
                c, st.model, c.max_context or self.ctx, log_verbosity=self.verbosity, label=f"prewarm-{c.name}"
            )
            why = asyncio.run(
                ttftrun.warm_only(
                    st.binaries, launch, st.study_dir / "logs", min(st.spec.lengths), server_timeout(st.spec)
                )
            )
            if why is not None:  # its round records the failure, if it is the configuration's own
                st.emit(StageEvent("ttft", "info", f"warming {c.name}'s server failed (its round retries): {why}"))

    def measure(self, todo: TtftTodo, round_number: int, what: str) -> float:
        """One fresh server for ``todo.config`` in round ``round_number``: its missing samples; its wall time."""
        st, c = self.st, todo.config
        reps = max((*todo.missing.values(), *(k for wanted in todo.turns.values() for k in wanted.values())))
        lengths = tuple(sorted(todo.missing)) or (max(st.spec.lengths),)
        # the lengths in an order that turns from round to round (and repetition to repetition): whatever the
        # warm-up leaves to the server's first prompt falls on each length in turn, never always on the shortest
        first = abs(round_number) - 1
        cold = [
            ttftrun.TtftPoint(L, r)
            for r in range(reps)
            for L in rotated(sorted(todo.missing), first + r)
            if r < todo.missing[L]
        ]
        # the other kinds after the cold samples (a cached turn's priming would otherwise leave a context in the slot)
        after = [
            ttftrun.TtftPoint(n, r, kind.depth(st.spec) or 0, chat=kind.chat)
            for kind in AFTER_COLD
            for wanted in (todo.turns.get(kind.name, {}),)
            for r in range(reps)
            for n in rotated(sorted(wanted), first + r)
            if r < wanted[n]
        ]
        plan = ttftrun.TtftPlan(
            lengths=lengths,
            reps=reps,
            response_tokens=st.spec.generated_tokens,
            cached_response_tokens=max(st.spec.response_tokens),  # their decode is the verdicts': steady, not scaled
            mode="cold",
            seed=time.time_ns() % 2**31,
            points=tuple(cold + after),
            max_ttft_s=st.spec.max_ttft_s,
            known=tuple((c.key, L, m) for L, m in todo.medians.items()),
            round=round_number,
        )
        t_start, stat_start = time.perf_counter(), proc_stat()
        t_up: list[float] = []
        busy_ns: list[int] = []

        def on_event(ev: object) -> None:
            if isinstance(ev, ServerUp):
                t_up.append(time.perf_counter())
            if isinstance(ev, SampleDone) and ev.sample.end_ns is not None:
                busy_ns.append(ev.sample.end_ns)
            if isinstance(ev, SampleDone) and ev.check is None and ev.sample.error is None:
                self.done += 1
                point = (
                    f"L={ev.sample.length}"
                    if COLD.owns(ev.sample.mode)
                    else f"+{ev.sample.length} @ {st.spec.turns_depth}"
                )
                st.emit(StageEvent("ttft", "progress", f"{what} {c.name} {point}", self.done, None))
            elif isinstance(ev, ConfigFailed):
                st.emit(StageEvent("ttft", "fail", f"{c.name} ({what}): {ev.reason}"))
            elif isinstance(ev, Rerun):
                st.emit(StageEvent("ttft", "progress", f"{c.name} L={ev.point.length}: re-run ({ev.reason})"))
            elif isinstance(ev, SkippedPoint):
                st.emit(
                    StageEvent(
                        "ttft",
                        "info",
                        f"{c.name} L={ev.length} skipped: about {ev.estimate_s:.0f} s > max-ttft {ev.max_ttft_s:.0f} s",
                    )
                )

        launch = ServerLaunch(c, st.model, c.max_context or self.ctx, log_verbosity=self.verbosity)
        with Store(st.study_dir) as store:
            run = ttftrun.TtftRun(store, plan, st.command, binaries=st.binaries, model=st.model, on_event=on_event)
            outcome = asyncio.run(
                run.run_managed([launch], st.study_dir / "logs", startup_timeout_s=server_timeout(st.spec))
            )
            self.failures += len(outcome.failures)
            if outcome.failures:
                self.failed.add(c.name)
            wall = time.perf_counter() - t_start
            shares = cpu_shares(stat_start, proc_stat())
            store.add_artifact(
                outcome.run_id,
                TTFT_EFFICIENCY,
                {
                    "label": c.name,
                    "config_key": c.key,
                    "round": round_number,
                    "wall_s": wall,
                    "load_s": (t_up[0] - t_start) if t_up else None,
                    "requests_s": sum(busy_ns) / 1e9,
                    "samples": len(busy_ns),
                    "cpu_busy": shares[0] if shares else None,
                    "cpu_steal": shares[1] if shares else None,
                },
            )
        self.walls[c.name] = wall
        return wall


def _keep(t: TtftTodo, open_: Mapping[str, Mapping[str, set[int]]], lack: frozenset[tuple[str, int]]) -> TtftTodo:
    """What a round past the study's first ones measures of ``t``: the sizes its open questions name (``open_``: per
    kind of turn, configuration -> sizes) and every point in ``lack`` (:func:`xover.measure.resume.lacking`)."""

    def wanted(kind: str, size: int) -> bool:
        return (kind, size) in lack or size in open_[kind].get(t.config.name, ())

    return dataclasses.replace(
        t,
        missing={L: k for L, k in t.missing.items() if wanted(COLD.name, L)},
        turns={kind: {x: k for x, k in sizes.items() if wanted(kind, x)} for kind, sizes in t.turns.items()},
    )


def _still_open(
    spec: StudySpec,
    data: StudyData,
    todo: Sequence[TtftTodo],
    pairs: Sequence[tuple[str, str]],
    closed: frozenset[int],
    compared: Sequence[tuple[str, str]],
) -> tuple[dict[str, dict[str, set[int]]], frozenset[tuple[str, int]]]:
    """What a round past the study's first ones would measure: per kind of turn, the configurations whose questions
    are open with their sizes (``pairs``: the pairs the verdicts answer; ``compared``: the pairs the report also
    tells, each configuration against its tuned variant, open only while they share too few rounds); and, after
    rounds left to another session (``closed``), the points some configuration still has too few rounds of, with
    every configuration at them (a configuration new to the spec, or one that failed there)."""
    inputs = {k.name: TURN_INPUTS[k.name](data) for k in TURN_KINDS}
    response = spec.response_tokens[0]
    open_ = {k.name: open_questions(inputs[k.name], pairs, response, compared) for k in TURN_KINDS}
    return open_, lacking(todo, inputs, COLD.name, spec.rounds) if closed else frozenset()


def _capped(
    st: Study,
    rounds: _Rounds,
    pairs: Sequence[tuple[str, str]],
    n: int,
    fresh: bool,
    closed: frozenset[int],
    compared: Sequence[tuple[str, str]],
) -> list[str]:
    """After max-rounds: the configurations a round ``n`` would still measure (not those that failed: more rounds
    would not help them), said in one line. Round numbers count from the store's first round, so a resume after
    rounds left to another session (``closed``) can reach max-rounds before it measures anything."""
    spec = st.spec
    data = load_if_any(st.study_dir)
    todo = ttft_todo(spec, data.ttft_rows, rounds.mk, n, fresh)
    open_, lack = _still_open(spec, data, todo, pairs, closed, compared)
    still = sorted(t.config.name for t in todo if _keep(t, open_, lack).anything and t.config.name not in rounds.failed)
    if still:
        why = (
            " (round numbers count from the store's first round, the rounds left to another session included)"
            if closed
            else ""
        )
        st.emit(
            StageEvent(
                "ttft",
                "info",
                f"max-rounds ({spec.max_rounds}) reached with questions still open ({', '.join(still)}): raise "
                f"max-rounds to measure more{why}",
            )
        )
    return still


def _overruns(st: Study, cost_s: float) -> bool:
    """Whether something that takes ``cost_s`` (what it took last time), started now, would end past the study's
    budget."""
    return st.spec.budget_s is not None and st.elapsed_s() + cost_s > st.spec.budget_s


def stage_ttft(st: Study, pairs: Sequence[tuple[str, str]], compared: Sequence[tuple[str, str]] = ()) -> int:
    """Cold TTFT in rounds of fresh servers (see the module's doc); ``pairs``: the pairs the study's verdicts answer
    (their open questions earn more rounds); ``compared``: the pairs the report also tells (each configuration
    against its tuned variant), which earn rounds only until they share enough to be compared. Returns the
    failures."""
    spec, emit = st.spec, st.emit
    rounds = _Rounds(st)
    fresh = st.fresh_in("ttft")
    base = last_round(load_if_any(st.study_dir).ttft_rows) if fresh else 0  # --fresh: new rounds after every stored one
    told: set[str] = set()
    last_wall, last_measured = 0.0, 0
    still: list[str] = []  # what max-rounds left open
    n = base + 1
    # rounds a former session of the machine began (another lease, a reboot): never finished here (their pairs
    # would mix two machines); what they lack is measured in later rounds where a question stays open
    closed = frozenset() if fresh else rounds_of_other_sessions(load_if_any(st.study_dir), rounds.mk, boot_id())
    while n <= base + spec.max_rounds:
        data = load_if_any(st.study_dir)
        todo = ttft_todo(spec, data.ttft_rows, rounds.mk, n, fresh)
        if n in closed:
            if any(t.anything for t in todo):
                left = ", ".join(t.config.name for t in todo if t.anything)
                emit(
                    StageEvent(
                        "ttft",
                        "info",
                        f"round {n - base}: begun in another session of this machine (another boot): left as it is "
                        f"(unmeasured there: {left}); later rounds measure what the open questions still need",
                    )
                )
            n += 1
            continue
        for t in todo:
            for note in t.notes:
                if note not in told:
                    told.add(note)
                    emit(StageEvent("ttft", "info", note))
        if n > base + spec.rounds:  # past the rounds every configuration gets: only where a question is open
            open_, lack = _still_open(spec, data, todo, pairs, closed, compared)
            open_names = sorted({name for per in open_.values() for name in per})
            if not open_names and not lack:
                break
            # only the sizes still open, kind by kind: a round past the first ones costs what the open questions need
            todo = [_keep(t, open_, lack) for t in todo]
            live = [t for t in todo if t.config.name not in rounds.failed]
            cost = round_cost(spec, data, live, rounds.mk)  # from the stored servers; else the last round's wall
            if _overruns(st, last_wall if cost is None else cost):
                short = sorted(t.config.name for t in live if t.anything)
                emit(
                    StageEvent(
                        "ttft",
                        "info",
                        f"round {n - base}: not measured, the study's budget of {spec.budget_s:.0f} s would run out "
                        f"(open: {', '.join(short or open_names)})",
                    )
                )
                break
        pending = {t.config.name: t for t in todo if t.anything and t.config.name not in rounds.failed}
        if pending:
            if not last_measured:  # this run's first round: each build's first server warmed first, not measured
                rounds.prewarm([pending[name].config for name in order(list(pending), n - base - 1)])
            emit(StageEvent("ttft", "info", f"round {n - base}: {', '.join(order(list(pending), n - base - 1))}"))
            t0 = time.perf_counter()
            for name in order(list(pending), n - base - 1):
                rounds.measure(pending[name], n, f"round {n - base}")
            last_wall, last_measured = time.perf_counter() - t0, n
        n += 1
    else:  # max-rounds reached: say what it leaves open
        still = _capped(st, rounds, pairs, n, fresh, closed, compared)
    if not last_measured and not rounds.failed and not still:
        emit(StageEvent("ttft", "info", "nothing left to measure: every configuration's cold samples are stored"))
    if rounds.failed:
        emit(
            StageEvent(
                "ttft",
                "info",
                f"not measured in later rounds after their failure (recorded; a resume retries them): "
                f"{', '.join(sorted(rounds.failed))}",
            )
        )
    first = spec.configs[0].name
    if last_measured and first not in rounds.failed:
        # what its last server took: a drift check past the budget would leave the lease or the user waiting
        if _overruns(st, rounds.walls.get(first, 0.0)):
            emit(
                StageEvent(
                    "ttft",
                    "info",
                    f"drift check: not measured, the study's budget of {spec.budget_s:.0f} s would run out",
                )
            )
        else:
            _drift_check(st, rounds, last_measured)
    return rounds.failures


def _drift_check(st: Study, rounds: _Rounds, last: int) -> None:
    """The first configuration once more, in a fresh server, after the stage's last round (round ``-last``)."""
    first = st.spec.configs[0]
    stored = load_if_any(st.study_dir).ttft_rows
    mine = [r.sample for r in stored if r.sample.config_key == first.key and r.model_key == rounds.mk]
    if any(s.round == -last for s in mine):
        return
    measured = sorted({s.length for s in mine if s.counted_cold and s.round is not None})
    if not measured:
        return
    medians = {
        L: statistics.median(
            s.first_token_ns / 1e9 for s in mine if s.length == L and s.counted_cold and s.first_token_ns
        )
        for L in measured
    }
    st.emit(StageEvent("ttft", "info", f"drift check: {first.name} once more, in a fresh server"))
    rounds.measure(TtftTodo(first, {L: 1 for L in measured}, medians, ()), -last, "drift check")
