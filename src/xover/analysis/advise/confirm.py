"""The recommendation confirmed through llama-server: cold TTFT and decode medians against the defaults'. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from xover.analysis.advise.objective import curve_at
from xover.analysis.advise.workload import Workload


@dataclasses.dataclass(frozen=True)
class ServerPoint:
    """Cold llama-server medians at one prompt length."""

    length: int  # prompt tokens
    ttft_s: float
    decode_tps: float


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The recommendation against the defaults through llama-server, cold TTFT and decode."""

    n_cpu_moe: int | None
    defaults: tuple[ServerPoint, ...]
    recommended: tuple[ServerPoint, ...]
    defaults_turn_s: float  # a turn's total (TTFT + answer) at the defaults
    recommended_turn_s: float
    repetitions: int

    @property
    def gain(self) -> float:
        return self.defaults_turn_s / self.recommended_turn_s


def server_turn_s(points: Sequence[ServerPoint], workload: Workload) -> float:
    """Expected time per turn from server medians: TTFT linear in L through 0 and the measured lengths,
    decode time per token linear in L (both extended as :func:`curve_at` does)."""
    ttft = [(0.0, 0.0), *sorted((float(p.length), p.ttft_s) for p in points)]
    spt = sorted((float(p.length), 1.0 / p.decode_tps) for p in points)
    return workload.expected(lambda t: curve_at(ttft, t.length) + t.response * curve_at(spt, t.length))


def confirmation(
    n_cpu_moe: int | None,
    defaults: Sequence[ServerPoint],
    recommended: Sequence[ServerPoint],
    workload: Workload,
    repetitions: int,
) -> Confirmation:
    return Confirmation(
        n_cpu_moe,
        tuple(defaults),
        tuple(recommended),
        server_turn_s(defaults, workload),
        server_turn_s(recommended, workload),
        repetitions,
    )
