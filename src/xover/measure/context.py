"""The context every stage of ``xover study`` works with (:class:`Study`) and the progress events it sends
(:class:`StageEvent`): below both :mod:`xover.measure.study`, which runs the stages, and the stage modules of their
own (:mod:`xover.measure.cold`), so that neither imports the other's runner."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import Binaries

DEFAULT_SERVER_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class StageEvent:
    stage: str
    status: str  # "start"/"done" (stage boundaries), "progress", "info", "skip", "fail"
    detail: str = ""
    completed: float | None = None
    total: float | None = None


Emit = Callable[[StageEvent], None]


@dataclasses.dataclass(frozen=True)
class Study:
    """What every stage works with: the spec (its configurations placed, tuned variants added once tuning ran),
    the model file, the llama.cpp binaries, the study directory, whether to measure again what is stored, the
    command that started the study (stored with every run) and where progress goes."""

    spec: StudySpec
    model: Path
    binaries: Binaries
    study_dir: Path
    fresh: frozenset[str]  # the stages whose stored results are measured again (in new rounds), not resumed
    command: tuple[str, ...]
    emit: Emit
    terms: Any = None  # the placement planner's view of the model, where a configuration has a fit level
    started: float = dataclasses.field(default_factory=time.perf_counter)  # the study's start (perf_counter s)

    def fresh_in(self, stage: str) -> bool:
        """Whether ``stage`` measures again what is stored (``--fresh``, or ``--remeasure STAGE``)."""
        return stage in self.fresh

    def elapsed_s(self) -> float:
        """Seconds since the study started (its ``budget`` counts these)."""
        return time.perf_counter() - self.started

    def with_configs(self, configs: tuple[LlamaConfig, ...]) -> Study:
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, configs=configs))


def server_timeout(spec: StudySpec) -> float:
    """Seconds a study waits for a llama-server to answer ``/health``: the spec's ``timeout`` (which
    bounds a llama-bench configuration, model load included, alike), else 600."""
    return spec.timeout_s if spec.timeout_s is not None else DEFAULT_SERVER_TIMEOUT_S
