"""Everything a report shows, read from the results store alone (no measuring, no network)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

from xover.analysis.crossover import ConfigData
from xover.records import BenchResult, Failure, Provenance, TtftSample
from xover.errors import XoverError
from xover.store import STORE_NAME, Store


@dataclasses.dataclass(frozen=True)
class StudyData:
    study_dir: str
    runs: tuple[dict[str, Any], ...]
    labels: dict[str, str]  # config key -> label
    bench: tuple[tuple[str, BenchResult], ...]  # (label, result)
    ttft: tuple[tuple[str, TtftSample], ...]  # (label, sample), every stored sample
    failures: tuple[tuple[str, Failure], ...]
    artifacts: tuple[tuple[int | None, str, Any], ...]
    session: tuple[Any, ...] = ()  # xover.report.session.SessionSeries, latest replay per config and mode

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
    from xover.report.session import load_session_series

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
