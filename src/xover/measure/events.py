"""The progress events the runners send their caller (the CLI's progress views, the study's stages).

One definition per kind of event, whichever runner sends it; a field that only some runners fill is
optional (None, or 0 for a count). Each runner's union of the events it sends closes the module
(:data:`TtftEvent`, :data:`SessionEvent`, :data:`LabEvent`, :data:`SweepEvent`, :data:`AdviseEvent`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from xover.domain.artifacts import SkippedPoint
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, Failure, SessionTurn, TtftPoint, TtftSample
from xover.llamacpp.bench import BenchJob, Plan

if TYPE_CHECKING:  # annotations only: the knob search is not needed at run time
    from xover.analysis.advise import Estimate, Measurement


# ---- every runner ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerUp:
    """A llama-server answered ``/health`` and its ``/props`` are stored (ttft, session, cache lab)."""

    label: str  # the configuration's label
    url: str
    log_path: Path | None  # None: a server xover did not start (--url)
    build_info: str | None = None  # /props build_info
    mode: str | None = None  # session: the cache mode
    scenario: str | None = None  # cache lab: the scenario
    settings: str | None = None  # cache lab: the scenario's server settings, in words
    pid: int | None = None  # cache lab: the server's process id


@dataclasses.dataclass(frozen=True)
class ConfigFailed:
    """A configuration (or one cache mode of it, or one cache-lab scenario) failed; its failure is stored
    and the run goes on with the next."""

    label: str  # the configuration's label
    reason: str  # one line
    skipped: int = 0  # planned requests or turns of it that will not run (llama-bench: 0, it counts its own tests)
    mode: str | None = None  # session: the cache mode that failed
    scenario: str | None = None  # cache lab: the scenario that failed
    config: LlamaConfig | None = None
    failure: Failure | None = None  # as stored


@dataclasses.dataclass(frozen=True)
class Note:
    """A warning or remark worth a line."""

    text: str
    label: str | None = None  # the configuration it concerns, where it concerns one


# ---- ttft ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SampleDone:
    label: str
    sample: TtftSample
    attempt: int  # 1 for the first try of a point
    check: str | None  # None: the cache check passed


@dataclasses.dataclass(frozen=True)
class Rerun:
    """A point whose sample failed its cache check, measured again with a fresh prompt."""

    label: str
    point: TtftPoint
    reason: str


# A point not measured (its TTFT, scaled from a shorter length, would exceed the plan's ``max_ttft_s``) is sent as
# the record stored for it, :class:`xover.domain.artifacts.SkippedPoint`.
TtftEvent = ServerUp | SampleDone | Rerun | ConfigFailed | Note | SkippedPoint


# ---- session ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sized:
    ctx_size: int
    max_prompt_tokens: int  # the longest turn with recorded replies (or without replies, for generated ones)
    reply_growth: float | None  # fed-back tokens per generated token (generated feed)
    need_tokens: int = 0  # the longest turn with its fed-back replies, plus the response: what a slot must hold


@dataclasses.dataclass(frozen=True)
class TurnDone:
    """A turn replayed and stored (its cache mode is the turn's own)."""

    label: str  # the configuration's
    turn: SessionTurn


@dataclasses.dataclass(frozen=True)
class ReplayDone:
    label: str  # the configuration's
    mode: str
    total_ns: int  # the sum of the turn times


SessionEvent = Sized | ServerUp | TurnDone | ReplayDone | ConfigFailed | Note


# ---- cache lab ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LabRequestDone:
    scenario: str
    sample: TtftSample
    ok: bool  # cache_n/prompt_n as predicted
    done: int  # requests finished so far (all scenarios)
    total: int  # requests planned


LabEvent = ServerUp | LabRequestDone | ConfigFailed


# ---- llama-bench sweep --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepPlanned:
    plan: Plan
    study_dir: Path  # where the sweep's store and logs go


@dataclasses.dataclass(frozen=True)
class ConfigStarted:
    job: BenchJob
    index: int  # 0-based among plan.jobs
    count: int


@dataclasses.dataclass(frozen=True)
class Progressed:
    """Tests completed across the whole sweep, fractional within the running test."""

    completed: float
    total: int  # tests planned


@dataclasses.dataclass(frozen=True)
class ResultStored:
    config: LlamaConfig
    result: BenchResult


@dataclasses.dataclass(frozen=True)
class Retrying:
    """A llama-bench process died by a signal xover did not send: its job runs again, once, in a fresh process."""

    config: LlamaConfig
    reason: str


SweepEvent = SweepPlanned | ConfigStarted | Progressed | ResultStored | ConfigFailed | Retrying


# ---- advise -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measuring:
    label: str
    number: int  # 1-based, across the whole run
    planned: int | None = None  # the processes the plan counts (a search may start fewer, or a few more)
    left_s: float | None = None  # the plan's estimate of what is left from this process on, confirmation included


@dataclasses.dataclass(frozen=True)
class Measured:
    label: str
    measurement: Measurement
    estimate: Estimate | None  # None when it could not be measured


AdviseEvent = Note | Measuring | Measured
