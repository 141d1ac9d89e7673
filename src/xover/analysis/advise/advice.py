"""The advice: everything ``xover advise`` found, as one record stored as artifact ``advise``. Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from xover.analysis.advise.confirm import Confirmation
from xover.analysis.advise.crossovers import RevisitedPair
from xover.analysis.advise.knobs import Knob, Setting, llama_config, normalize, server_command, setting_label
from xover.analysis.advise.search import Search
from xover.analysis.advise.theory_notes import THEORY_NO_EFFECT, Expectation
from xover.analysis.advise.workload import Workload
from xover.domain.codec import decode, encode
from xover.domain.study_spec import LlamaConfig
from xover.errors import XoverError

SCHEMA = "xover.advise/1"
ARTIFACT = "advise"


@dataclasses.dataclass(frozen=True)
class Advice:
    """Everything ``xover advise`` found, stored as artifact ``advise`` and rendered by
    :mod:`xover.report.advise`."""

    model: str
    backend: str  # llama.cpp's backends as llama-bench reports them: CPU, CUDA...
    hardware: str
    workload: Workload
    workload_note: str  # how the workload was chosen (scaled, from a file...)
    chunk: int  # P of pp{P}
    n_gen: int  # T of tg{T}
    repetitions: int
    knobs: tuple[Knob, ...]
    searches: tuple[Search, ...]
    expectations: tuple[Expectation, ...]
    crossovers: tuple[RevisitedPair, ...]
    confirmation: Confirmation | None
    schema: str = SCHEMA

    @property
    def best(self) -> Search:
        """The offload level whose recommendation is fastest."""
        return min(self.searches, key=lambda s: s.best.estimate.turn_s)  # type: ignore[union-attr]

    @property
    def measurements(self) -> int:
        return sum(s.measurements for s in self.searches)

    @property
    def reused(self) -> int:
        return sum(s.reused for s in self.searches)

    def config(self, search: Search, setting: Setting) -> LlamaConfig:
        return llama_config(
            self.knobs, setting, search.n_cpu_moe, f"{search.label} {setting_label(self.knobs, setting)}"
        )

    def command(self, model: str | None = None) -> str:
        """The recommended llama-server command line."""
        best = self.best
        return server_command(self.config(best, best.recommended), model or self.model)

    def no_effect(self, search: Search) -> tuple[str, ...]:
        return tuple(v.knob for v in search.verdicts if v.no_effect)

    def expectation(self, search: Search, setting: Setting) -> Expectation | None:
        return next((e for e in self.expectations if e.n_cpu_moe == search.n_cpu_moe and e.setting == setting), None)

    def doubts(self, search: Search) -> tuple[str, ...]:
        """Where the measurements contradict themselves or the theory: a kept value the theory expects
        to change nothing, and kept values that measure slower together than one of them alone. Both
        point at load that changed between measurements (beyond the drift the re-measured defaults
        showed) or at an interaction between knobs."""
        out = []
        for v in search.verdicts:
            if v.kept is None:
                continue
            expected = self.expectation(search, normalize(self.knobs, {v.knob: v.kept}))
            if expected is not None and expected.change is not None and abs(expected.change - 1.0) < THEORY_NO_EFFECT:
                out.append(
                    f"{v.knob}={v.kept} was kept, but the theory expects no effect here ({expected.note}): "
                    "likely load that changed between measurements; rerun to check"
                )
        singles = [search.trial(normalize(self.knobs, {v.knob: v.kept})) for v in search.verdicts if v.kept is not None]
        combined = search.trial(search.combination)
        if len(singles) >= 2 and combined.estimate is not None:
            best = min(singles, key=lambda t: t.estimate.turn_s if t.estimate else math.inf)
            if best.estimate is not None and combined.estimate.turn_s > best.estimate.turn_s:
                out.append(
                    f"the kept values together ({combined.label}) measured slower than {best.label} alone: "
                    "their effects do not add up (an interaction, or load that changed between measurements)"
                )
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return encode(self)


def advice_from_dict(data: Mapping[str, Any]) -> Advice:
    """The inverse of :meth:`Advice.to_dict` (a stored artifact back to the records)."""
    if data.get("schema") != SCHEMA:
        raise XoverError(f"not a {SCHEMA} advise record: rerun xover advise with this version")
    return decode(Advice, data)
