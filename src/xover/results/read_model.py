"""The read model of a study directory: everything its readers use (the report, the exports, the audit,
a resumed study), read from the results store alone (no measuring, no network).

:func:`load` is the one place that turns the store's rows into what readers use; the store
(:mod:`xover.results.store`) stays the only codec. Everything else here is pure: typed records and
views over a :class:`StudyData`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from xover.analysis.advise import Search
from xover.analysis.crossover import ConfigData
from xover.domain import artifacts as art
from xover.domain.artifacts import FitRecord, Prediction, SkippedPoint, StudyRecord, TuneRecord
from xover.domain.codec import decode
from xover.domain.config import LlamaConfig
from xover.domain.records import CHAT_MODE, BenchResult, Failure, Provenance, SessionTurn, TtftSample, cached_depth
from xover.errors import XoverError
from xover.results.store import STORE_NAME, Store

T = TypeVar("T")

MODE_ORDER = ("default", "reuse", "off")  # the verdict's primary mode is the first one measured
SESSION_GAP_S = 600
"""Runs stored without a boot id (xover before its provenance stored one) are of one session of the machine until
more than this passes between one run's end (its last request, or its finish) and the next run's start. One study's
servers follow each other within seconds (at most about 2 minutes apart in the committed studies); leases of a lent
machine hold it at most 30 minutes and the committed ones were 1.9 hours apart or more. Too short a gap splits a
round and leaves it "not yet compared"; too long a one pairs two hosts."""
WRITTEN_BY = "xover bench/ttft/study"


# ---- stored records with their place in the store --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StoredRun:
    """One run (one invocation that measured), as stored."""

    id: int
    kind: str  # bench, ttft, cache, study...
    command: tuple[str, ...]  # the argv that started it
    started_at: str
    started_unix_ns: int | None  # the same instant, precise (schema v2; None in older stores)
    finished_at: str | None
    status: str  # running, done, interrupted, failed
    provenance: Provenance

    @property
    def start_ns(self) -> int:
        """The run's start in unix ns: the precise column (schema v2), else its second-resolution timestamp."""
        if self.started_unix_ns:
            return int(self.started_unix_ns)
        return _unix_ns(self.started_at)

    @property
    def finish_ns(self) -> int | None:
        """The run's finish in unix ns (second resolution); None where it never finished (killed, or running)."""
        return _unix_ns(self.finished_at) if self.finished_at else None


def _unix_ns(stamp: str) -> int:
    """A store timestamp (``now_iso``: second resolution, with its offset) in unix ns."""
    return int(datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp() * 1e9)


class Artifact(NamedTuple):
    """A stored artifact (server props, theory prediction, tuning, study layout...): its body is the JSON as stored."""

    run_id: int | None
    name: str
    body: Any


@dataclasses.dataclass(frozen=True)
class StoredResult:
    """A llama-bench result with the run and model that measured it."""

    run_id: int
    model_key: str  # the model of the run that measured it
    result: BenchResult


@dataclasses.dataclass(frozen=True)
class StoredFailure:
    """A failure with the run that recorded it."""

    run_id: int
    model_key: str | None  # the model of the run that recorded it
    failure: Failure


@dataclasses.dataclass(frozen=True)
class StoredSample:
    """A TTFT sample with its row, run, configuration label and model."""

    row_id: int
    run_id: int
    label: str
    sample: TtftSample
    model_key: str = ""


@dataclasses.dataclass(frozen=True)
class StoredTurn:
    """An agentic session turn with its row, run and model."""

    row_id: int  # the turn's row in session_turns
    run_id: int
    model_key: str
    turn: SessionTurn


# ---- agentic session series ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SessionSeries:
    """One replay of a session: one configuration, one cache mode, its turns in order."""

    run_id: int
    label: str
    mode: str
    session_id: str
    feed: str
    turns: tuple[SessionTurn, ...]

    @property
    def complete(self) -> bool:
        return bool(self.turns) and all(
            t.turn == i and t.error is None and t.end_ns is not None for i, t in enumerate(self.turns)
        )

    @property
    def total_ns(self) -> int | None:
        """The session's time, the sum of its turn times; None unless every turn completed."""
        return sum(t.end_ns for t in self.turns if t.end_ns is not None) if self.complete else None

    def cumulative_s(self) -> list[float]:
        out, acc = [], 0
        for t in self.turns:
            if t.end_ns is None:
                break
            acc += t.end_ns
            out.append(acc / 1e9)
        return out


def series_from_rows(rows: Iterable[tuple[int, str, SessionTurn]]) -> list[SessionSeries]:
    """(run id, label, turn) rows -> the series of the most recently replayed workload (session id and
    feed of the latest run), the latest run per label and mode, labels in first-seen order."""
    groups: dict[tuple[int, str, str, str, str], list[SessionTurn]] = {}
    for run_id, label, t in rows:
        groups.setdefault((run_id, label, t.mode, t.session_id, t.feed), []).append(t)
    if not groups:
        return []
    _, _, _, sid, feed = max(groups, key=lambda k: k[0])
    latest: dict[tuple[str, str], tuple[int, list[SessionTurn]]] = {}
    for (run_id, label, mode, s, f), turns in groups.items():
        if (s, f) == (sid, feed) and run_id >= latest.get((label, mode), (-1, []))[0]:
            latest[(label, mode)] = (run_id, turns)
    labels = list(dict.fromkeys(label for label, _ in latest))
    out = []
    for label in labels:
        for mode in sorted({m for lb, m in latest if lb == label}, key=mode_rank):
            run_id, turns = latest[(label, mode)]
            out.append(SessionSeries(run_id, label, mode, sid, feed, tuple(sorted(turns, key=lambda t: t.turn))))
    return out


def mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


# ---- the study ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StudyData:
    """Everything stored in one study directory, oldest first. ``bench``, ``ttft`` and ``failures`` are the
    report's view (each record with its configuration's label); the ``*_rows`` fields hold the same records
    with their place in the store (row, run, model), for the exports, the audit and a resumed study."""

    study_dir: str
    runs: tuple[StoredRun, ...]
    labels: dict[str, str]  # config key -> label
    bench: tuple[tuple[str, BenchResult], ...]  # (label, result)
    ttft: tuple[tuple[str, TtftSample], ...]  # (label, sample), every stored sample
    failures: tuple[tuple[str, Failure], ...]  # (label, failure)
    artifacts: tuple[Artifact, ...]
    session: tuple[SessionSeries, ...] = ()  # the latest replay per config and cache mode
    configs: tuple[LlamaConfig, ...] = ()  # in the order they were first stored, named by their latest label
    bench_rows: tuple[StoredResult, ...] = ()
    ttft_rows: tuple[StoredSample, ...] = ()
    failure_rows: tuple[StoredFailure, ...] = ()
    turn_rows: tuple[StoredTurn, ...] = ()  # every stored session turn (``session`` keeps the latest replays)

    @property
    def provenances(self) -> list[Provenance]:
        return [r.provenance for r in self.runs]

    def config_labels(self) -> list[str]:
        """Labels in first-seen order across bench and TTFT results."""
        seen: dict[str, None] = {}
        for label, _ in self.bench:
            seen.setdefault(label, None)
        for label, _ in self.ttft:
            seen.setdefault(label, None)
        return list(seen)

    def cold_samples(self) -> list[tuple[str, TtftSample]]:
        """Cold samples that passed their cold check and completed; the only ones averaged as cold. Where a
        configuration was measured at a length both before rounds and in rounds of fresh servers, the rounds
        supersede the older samples."""
        return [(row.label, row.sample) for row in self.cold_rows()]

    def cached_samples(self) -> dict[int, list[tuple[str, TtftSample]]]:
        """Cached agentic turns' samples whose cached part was proven (``cache_n`` the depth, or one less after a
        restored sliding-window checkpoint: :func:`xover.measure.ttft.check_cache`), by depth."""
        out: dict[int, list[tuple[str, TtftSample]]] = defaultdict(list)
        for row in self.ttft_rows:
            depth = cached_depth(row.sample.mode)
            if depth is not None and row.sample.counted_cached and row.row_id not in self.off_session:
                out[depth].append((row.label, row.sample))
        return dict(out)

    def chat_samples(self) -> list[tuple[str, TtftSample]]:
        """Chat-shaped cold samples (mode ``chat``) that passed their cold check and completed, of a round (not a
        drift check)."""
        return [
            (row.label, row.sample)
            for row in self.ttft_rows
            if row.sample.mode == CHAT_MODE
            and row.sample.counted
            and not row.sample.drift_check
            and row.row_id not in self.off_session
        ]

    def cold_rows(self) -> list[StoredSample]:
        """The rows of :meth:`cold_samples`, with their run and model."""
        counted = [row for row in self.ttft_rows if row.sample.counted_cold]
        in_rounds = {(row.sample.config_key, row.sample.length) for row in counted if row.sample.round is not None}
        off = self.off_session  # after in_rounds: a point measured in rounds never falls back to older samples
        return [
            row
            for row in counted
            if (row.sample.round is not None or (row.sample.config_key, row.sample.length) not in in_rounds)
            and row.row_id not in off
        ]

    def run_sessions(self) -> dict[int, str]:
        """Run id -> the session of the machine it ran in: its boot id where its provenance stored one; else the
        runs stored without one, split where more than :data:`SESSION_GAP_S` passed between runs."""
        last_seen: dict[int, int] = defaultdict(int)  # run id -> when it was last seen (unix ns)
        for row in self.ttft_rows:  # its requests' ends
            s = row.sample
            last_seen[row.run_id] = max(last_seen[row.run_id], s.sent_at_unix_ns + (s.end_ns or 0))
        for run in self.runs:  # its finish, where stored
            last_seen[run.id] = max(last_seen[run.id], run.finish_ns or 0)
        out: dict[int, str] = {}
        legacy, last = 0, None
        for run in sorted(self.runs, key=lambda r: r.start_ns):
            boot = dict(run.provenance.extra).get("boot_id")
            if boot:
                out[run.id] = boot
                continue
            if last is not None and run.start_ns - last > SESSION_GAP_S * 1e9:
                legacy += 1
            out[run.id] = f"without a boot id, #{legacy}"
            last = max(last or 0, run.start_ns, last_seen.get(run.id, 0))
        return out

    @functools.cached_property
    def off_session(self) -> frozenset[int]:
        """The rows (ids) of round samples measured in another session of the machine (:meth:`run_sessions`) than
        the one that began their round (its first run, per model): left out of the rounds and of what is averaged.
        A round pairs servers measured together on one machine; a lease that ended mid-round and a later one that
        completed it paired two hosts (1.4-1.6x apart where experts ran on the CPU)."""
        sessions = self.run_sessions()
        start = {r.id: r.start_ns for r in self.runs}
        rows = [  # a row whose run is not stored has no session to judge by: left as it is
            row
            for row in self.ttft_rows
            if row.sample.round is not None and row.sample.round > 0 and row.run_id in start
        ]
        first: dict[tuple[str, int], int] = {}  # (model, round) -> the run that began it
        for row in rows:
            k = (row.model_key, row.sample.round or 0)
            if k not in first or start[row.run_id] < start[first[k]]:
                first[k] = row.run_id
        return frozenset(
            row.row_id
            for row in rows
            if sessions[row.run_id] != sessions[first[(row.model_key, row.sample.round or 0)]]
        )

    def off_session_rows(self) -> list[StoredSample]:
        """The counted samples :attr:`off_session` leaves out, for the report to name."""
        off = self.off_session
        return [r for r in self.ttft_rows if r.row_id in off and (r.sample.counted_cold or r.sample.counted_cached)]

    def drift_samples(self) -> list[tuple[str, TtftSample]]:
        """The counted cold samples of drift checks: the first configuration measured again, in a fresh server, at
        the end of its stage (:data:`xover.domain.records.ROUND_DOC`)."""
        return [(lb, s) for lb, s in self.ttft if s.mode == "cold" and s.counted and s.drift_check]

    @property
    def in_rounds(self) -> bool:
        """Whether the study's cold TTFT was measured in rounds of fresh servers (else one server per
        configuration, before xover measured in rounds)."""
        return any(s.round is not None for _, s in self.cold_samples())

    def artifact_bodies(self, name: str) -> list[Any]:
        """The bodies of the artifacts called ``name``, oldest first, as stored. The artifacts with a typed
        record (:mod:`xover.domain.artifacts`) are read through the accessors below."""
        return [a.body for a in self.artifacts if a.name == name]

    def _records(self, name: str, parse: Callable[[Any], T]) -> list[T]:
        """The readable bodies of the artifacts called ``name``, read by ``parse``, oldest first."""
        found = (art.readable(parse, body) for body in self.artifact_bodies(name))
        return [r for r in found if r is not None]

    def prediction(self) -> Prediction | None:
        """The first theory prediction stored in the study (made before any measurement), if any: what
        :func:`xover.analysis.theory.build_prediction` returned, typed (and still that mapping)."""
        found = self._records(art.PREDICTION, Prediction.from_body)
        return found[0] if found else None

    def workload(self) -> art.WorkloadRecord | None:
        """The recording the study was sized from (its latest ``workload`` artifact); None for other studies."""
        found = self._records(art.WORKLOAD, art.WorkloadRecord.from_body)
        return found[-1] if found else None

    def study_record(self) -> StudyRecord | None:
        """What the study stored of its spec (its latest ``study`` artifact); None for a store without one
        (``xover bench``, ``xover ttft``)."""
        found = self._records(art.STUDY, StudyRecord.from_body)
        return found[-1] if found else None

    def recorded_turns(self) -> tuple[tuple[int, ...], tuple[int, int]] | None:
        """The response lengths and agentic band the study measured for (its latest ``study`` artifact), so a
        rebuilt report prices turns as the study's own did; None for a store without one (``xover bench``,
        ``xover ttft``)."""
        study = self.study_record()
        return study.turns if study is not None else None

    def tune_results(self) -> tuple[TuneRecord, ...]:
        """The latest tuning result (artifact ``tune``) of each base configuration, in the order the configurations
        first appear, its search read back (:class:`xover.analysis.advise.Search`)."""
        return art.latest_tunes(self.artifact_bodies(art.TUNE), _read_search)

    def fit_records(self, suffix: str = "", checked: bool = False) -> tuple[FitRecord, ...] | None:
        """The latest stored list of fit records: the planner's (artifact ``fit{suffix}``) or, ``checked``,
        llama.cpp's word on them (``fit-check{suffix}``); ``suffix`` :data:`xover.domain.artifacts.TUNED` for the
        tuned variants'. None where none is stored."""
        found = self._records(art.fit_artifact(suffix, checked), art.fit_records)
        return found[-1] if found else None

    def skipped_points(self) -> dict[tuple[str, int], SkippedPoint]:
        """(configuration, prompt length) -> the latest point of that length a max-ttft skipped (artifact
        ``ttft-skipped``): its estimate, the length it was scaled from and the cap."""
        return {(p.config, p.length): p for p in self._records(art.TTFT_SKIPPED, SkippedPoint.from_body)}


def _read_search(raw: Any) -> Any:
    """A stored tuning search back as :class:`xover.analysis.advise.Search`."""

    return decode(Search, raw)


def require_store(study_dir: Path, written_by: str = WRITTEN_BY) -> None:
    """Fail in one line where there is no store to read (opening one would create an empty one)."""
    if not (study_dir / STORE_NAME).is_file():
        raise XoverError(f"{study_dir} holds no {STORE_NAME}: pass a study directory written by {written_by}")


def _run(d: dict[str, Any]) -> StoredRun:
    return StoredRun(
        id=d["id"],
        kind=d["kind"],
        command=tuple(d["command"]),
        started_at=d["started_at"],
        started_unix_ns=d.get("started_unix_ns"),
        finished_at=d.get("finished_at"),
        status=d["status"],
        provenance=d["provenance"],
    )


@dataclasses.dataclass(frozen=True)
class VramBudget:
    """The VRAM budget runs of the study were held to (``xover.hardware.vram``; provenance extras ``vram_*``)."""

    budget: int
    device: int
    held: int
    free_after: int
    total: int
    gpu: str | None
    short_runs: int = 0  # runs that began with part of the budget taken by another process (``vram_shortfall``)
    most_short: int = 0  # the largest such shortfall, bytes


def vram_budgets(data: StudyData) -> tuple[VramBudget, ...]:
    """Every distinct budget a run of the study measured under, in run order (none: the whole card), with how many
    of its runs found part of it taken for good (:func:`xover.hardware.vram.settle`)."""
    out: dict[tuple[int, str | None], VramBudget] = {}
    for run in data.runs:
        extra = dict(run.provenance.extra)
        if "vram_budget" not in extra:
            continue
        try:
            b = VramBudget(
                int(extra["vram_budget"]),
                int(extra.get("vram_device", 0)),
                int(extra.get("vram_held", 0)),
                int(extra.get("vram_free_after", 0)),
                int(extra.get("vram_total", 0)),
                run.provenance.gpu_info,
            )
            short = int(extra.get("vram_shortfall", 0))
        except ValueError:
            continue
        b = out.setdefault((b.budget, b.gpu), b)
        if short > 0:
            out[(b.budget, b.gpu)] = dataclasses.replace(
                b, short_runs=b.short_runs + 1, most_short=max(b.most_short, short)
            )
    return tuple(out.values())


def load_if_any(study_dir: Path | str) -> StudyData:
    """What a study directory holds so far: its read model, or an empty one where nothing is stored yet (a study
    about to start; reading creates no store)."""
    path = Path(study_dir)
    if not (path / STORE_NAME).is_file():
        return StudyData(study_dir=str(path), runs=(), labels={}, bench=(), ttft=(), failures=(), artifacts=())
    return load(path)


def _latest_tests(rows: Sequence[tuple[int, int, str, BenchResult]]) -> list[tuple[int, int, str, BenchResult]]:
    """The latest record of each llama-bench test (configuration, model, pp/tg/depth, round), in stored order: a
    test measured again (``--fresh``, or the fresh process that retried one killed from outside after it had stored
    some tests) supersedes the earlier record, which stays in the store as raw data."""
    latest: dict[tuple[object, ...], int] = {}
    for i, (_, _, mk, r) in enumerate(rows):
        latest[(r.config_key, mk, r.n_prompt, r.n_gen, r.n_depth, r.round)] = i
    keep = set(latest.values())
    return [row for i, row in enumerate(rows) if i in keep]


def load(study_dir: Path | str, written_by: str = WRITTEN_BY) -> StudyData:
    """The read model of a study directory; ``written_by`` names, in the error where there is no store,
    the commands that write one."""
    path = Path(study_dir)
    require_store(path, written_by)
    with Store(path) as st:
        configs = tuple(st.configs())
        runs = tuple(_run(r) for r in st.runs())
        bench = st.bench_results()
        ttft = st.ttft_samples()
        failures = st.failures()
        turns = st.session_turns()
        artifacts = tuple(Artifact(run_id, name, body) for run_id, name, body in st.artifacts())
    labels = {c.key: c.name for c in configs}

    def label(key: str) -> str:
        return labels.get(key, key[:8])

    run_models = {r.id: r.provenance.model.key if r.provenance.model else None for r in runs}
    ttft_rows = tuple(
        StoredSample(row_id, run_id, label(s.config_key), s, model_key) for row_id, run_id, model_key, s in ttft
    )
    turn_rows = tuple(StoredTurn(row_id, run_id, model_key, t) for row_id, run_id, model_key, t in turns)
    return StudyData(
        study_dir=str(path),
        runs=runs,
        labels=labels,
        bench=tuple((label(r.config_key), r) for _, _, _, r in _latest_tests(bench)),
        ttft=tuple((s.label, s.sample) for s in ttft_rows),
        failures=tuple((label(f.config_key), f) for _, f in failures),
        artifacts=artifacts,
        session=tuple(series_from_rows((t.run_id, label(t.turn.config_key), t.turn) for t in turn_rows)),
        configs=configs,
        bench_rows=tuple(StoredResult(run_id, model_key, r) for _, run_id, model_key, r in bench),
        ttft_rows=ttft_rows,
        failure_rows=tuple(StoredFailure(run_id, run_models.get(run_id), f) for run_id, f in failures),
        turn_rows=turn_rows,
    )


# ---- views ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchData:
    """A study's llama-bench results as stored, oldest first: what the llama-bench exports render."""

    configs: tuple[LlamaConfig, ...]  # those with llama-bench results or failures
    results: tuple[StoredResult, ...]
    failures: tuple[StoredFailure, ...]
    model_names: dict[str, str]  # model key -> file name


def bench_data(data: StudyData, config_keys: Collection[str] | None = None) -> BenchData:
    """Everything llama-bench-related in a study, optionally limited to some configurations."""

    def wanted(key: str) -> bool:
        return config_keys is None or key in config_keys

    names: dict[str, str] = {}
    for run in data.runs:
        model = run.provenance.model
        if model:
            names[model.key] = model.name
    results = tuple(s for s in data.bench_rows if wanted(s.result.config_key))
    failures = tuple(f for f in data.failure_rows if f.failure.stage == "bench" and wanted(f.failure.config_key))
    benched = {r.result.config_key for r in results} | {f.failure.config_key for f in failures}
    return BenchData(
        configs=tuple(c for c in data.configs if c.key in benched),
        results=results,
        failures=failures,
        model_names=names,
    )


def cached_inputs(data: StudyData, depth: int | None = None) -> list[ConfigData]:
    """Per configuration, its cached agentic turns at ``depth`` (default: the deepest measured) as the crossover's
    inputs, keyed by new tokens per turn: TTFT samples (s) and the decode speed the same requests measured (on top
    of the depth and the new tokens); per round where measured in rounds. Empty without cached turns."""
    by_depth = data.cached_samples()
    if not by_depth:
        return []
    depth = max(by_depth) if depth is None else depth
    ttft, dec, rounds = _per_length(by_depth.get(depth, []))
    return [
        ConfigData(label, dict(ttft[label]), dict(dec[label]), None, (), {n: dict(v) for n, v in rounds[label].items()})
        for label in data.config_labels()
        if ttft.get(label) and dec.get(label)
    ]


def chat_inputs(data: StudyData) -> list[ConfigData]:
    """Per configuration, its chat-shaped cold prompts as the crossover's inputs (TTFT samples and the same requests'
    decode, per length; per round): beside the cold inputs of the same lengths, the shape's effect."""
    ttft, dec, rounds = _per_length(data.chat_samples())
    return [
        ConfigData(label, dict(ttft[label]), dict(dec[label]), None, (), {n: dict(v) for n, v in rounds[label].items()})
        for label in data.config_labels()
        if ttft.get(label) and dec.get(label)
    ]


def _per_length(
    samples: Sequence[tuple[str, TtftSample]],
) -> tuple[
    dict[str, dict[int, list[float]]],
    dict[str, dict[int, list[float]]],
    dict[str, dict[int, dict[int, tuple[float, float]]]],
]:
    """Per configuration and length: TTFT samples (s), the server's decode speeds from the same requests, and per
    round the medians of both (a round's total needs its decode speed)."""
    ttft: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    dec: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_round: dict[tuple[str, int, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for label, s in samples:
        ttft[label][s.length].append(s.first_token_ns / 1e9)  # type: ignore[operator]
        decode = s.timings.predicted_per_second if s.timings is not None else None
        if decode:
            dec[label][s.length].append(decode)
        if s.round is not None:
            t, d = by_round[(label, s.length, s.round)]
            t.append(s.first_token_ns / 1e9)  # type: ignore[operator]
            d.extend([decode] if decode else [])
    rounds: dict[str, dict[int, dict[int, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    for (label, length, n), (t, d) in by_round.items():
        if d:
            rounds[label][length][n] = (statistics.median(t), statistics.median(d))
    return ttft, dec, rounds


def crossover_inputs(data: StudyData) -> list[ConfigData]:
    """Per configuration: cold TTFT samples (s) per length, and decode speed per depth.

    Decode speed at depth L is the server's own ``predicted_per_second`` from the same cold
    requests (the response really is decoded on top of L tokens); configurations without it fall
    back to llama-bench's ``tg @ dL``.
    """
    ttft, dec, rounds = _per_length(data.cold_samples())
    without_server_decode = {label for label in ttft if not dec.get(label)}
    for label, r in data.bench:
        if r.n_prompt == 0 and r.n_gen > 0 and label in without_server_decode:
            dec[label][r.n_depth].extend(r.samples_ts)
    limits, slow = placement_limits(data), too_slow(data)
    out = []
    for label in data.config_labels():
        if ttft.get(label) and dec.get(label):
            skipped = tuple(sorted((L, e) for L, e in slow.get(label, {}).items() if L not in ttft[label]))
            per_round = {L: dict(v) for L, v in rounds.get(label, {}).items()}
            out.append(ConfigData(label, dict(ttft[label]), dict(dec[label]), limits.get(label), skipped, per_round))
    return out


TURN_INPUTS: dict[str, Callable[[StudyData], list[ConfigData]]] = {
    "cold": crossover_inputs,
    "chat": chat_inputs,
    "cached": lambda data: cached_inputs(data),
}
"""Per kind of turn (:data:`xover.domain.turn_kinds.TURN_KINDS`, by name): its samples as the crossover's inputs, per
configuration and tokens per turn, per round where measured in rounds."""


def too_slow(data: StudyData) -> dict[str, dict[int, float]]:
    """Configuration -> prompt length -> estimated cold TTFT (s), for the lengths a max-ttft skipped (the latest
    estimate of each, :meth:`StudyData.skipped_points`)."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for (label, length), point in data.skipped_points().items():
        out[label][length] = point.estimate_s
    return dict(out)


def fit_placements(data: StudyData) -> list[FitRecord]:
    """The latest record of each ``fit`` configuration and of each tuned variant of one: from llama.cpp's check
    (artifacts ``fit-check``, ``fit-check-tuned``) where it ran, else the planner's (``fit``, ``fit-tuned``)."""
    out: list[FitRecord] = []
    for suffix in art.FIT_SUFFIXES:
        checked = data.fit_records(suffix, checked=True)
        out += checked if checked is not None else data.fit_records(suffix) or ()
    return out


def placement_limits(data: StudyData) -> dict[str, int]:
    """Configuration -> the longest prompt its placement holds: a ``fit@L`` level holds L tokens and their
    response, no more."""
    return {r.config: r.limit for r in fit_placements(data) if r.limit is not None}
