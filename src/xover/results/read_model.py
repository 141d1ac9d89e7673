"""Everything a report shows, read from the results store alone (no measuring, no network)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from xover.analysis.crossover import ConfigData
from xover.domain.records import BenchResult, Failure, Provenance, SessionTurn, TtftSample
from xover.errors import XoverError
from xover.results.store import STORE_NAME, Store


MODE_ORDER = ("default", "reuse", "off")  # the verdict's primary mode is the first one measured


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
            t.turn == i and t.error is None and t.end_ns is not None for i, t in enumerate(self.turns))

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


def load_session_series(store: Store) -> list[SessionSeries]:
    """The session series stored in ``store`` (see :func:`series_from_rows`)."""
    labels = {c.key: c.label for c in store.configs("server")}
    return series_from_rows((run_id, labels.get(t.config_key, t.config_key[:8]), t) for _, run_id, _, t in store.session_turns())


@dataclasses.dataclass(frozen=True)
class StudyData:
    study_dir: str
    runs: tuple[dict[str, Any], ...]
    labels: dict[str, str]  # config key -> label
    bench: tuple[tuple[str, BenchResult], ...]  # (label, result)
    ttft: tuple[tuple[str, TtftSample], ...]  # (label, sample), every stored sample
    failures: tuple[tuple[str, Failure], ...]
    artifacts: tuple[tuple[int | None, str, Any], ...]
    session: tuple[SessionSeries, ...] = ()  # the latest replay per config and cache mode

    @property
    def provenances(self) -> list[Provenance]:
        return [r["provenance"] for r in self.runs]

    def config_labels(self) -> list[str]:
        """Labels in first-seen order across bench and TTFT results."""
        seen: dict[str, None] = {}
        for label, _ in self.bench:
            seen.setdefault(label, None)
        for label, _ in self.ttft:
            seen.setdefault(label, None)
        return list(seen)

    def cold_samples(self) -> list[tuple[str, TtftSample]]:
        """Cold samples that passed their cold check and completed; the only ones averaged as cold."""
        return [(lb, s) for lb, s in self.ttft if s.mode == "cold" and s.cache_ok and s.error is None
                and s.first_token_ns is not None]


def load(study_dir: Path | str) -> StudyData:
    path = Path(study_dir)
    if not (path / STORE_NAME).exists():
        raise XoverError(f"{path} holds no {STORE_NAME}: pass a study directory written by xover bench/ttft/study")
    with Store(path) as st:
        labels = {c.key: c.label for c in st.configs()}
        return StudyData(
            study_dir=str(path),
            runs=tuple(st.runs()),
            labels=labels,
            bench=tuple((labels.get(r.config_key, r.config_key[:8]), r) for _, _, _, r in st.bench_results()),
            ttft=tuple((labels.get(s.config_key, s.config_key[:8]), s) for _, _, _, s in st.ttft_samples()),
            failures=tuple((labels.get(f.config_key, f.config_key[:8]), f) for _, f in st.failures()),
            artifacts=tuple(st.artifacts()),
            session=tuple(load_session_series(st)),
        )


def crossover_inputs(data: StudyData) -> list[ConfigData]:
    """Per configuration: cold TTFT samples (s) per length, and decode speed per depth.

    Decode speed at depth L is the server's own ``predicted_per_second`` from the same cold
    requests (the response really is decoded on top of L tokens); configurations without it fall
    back to llama-bench's ``tg @ dL``.
    """
    ttft: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    dec: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for label, s in data.cold_samples():
        ttft[label][s.length].append(s.first_token_ns / 1e9)  # type: ignore[operator]
        if s.timings is not None and s.timings.predicted_per_second:
            dec[label][s.length].append(s.timings.predicted_per_second)
    without_server_decode = {label for label in ttft if not dec.get(label)}
    for label, r in data.bench:
        if r.n_prompt == 0 and r.n_gen > 0 and label in without_server_decode:
            dec[label][r.n_depth].extend(r.samples_ts)
    out = []
    for label in data.config_labels():
        if ttft.get(label) and dec.get(label):
            out.append(ConfigData(label, dict(ttft[label]), dict(dec[label])))
    return out
