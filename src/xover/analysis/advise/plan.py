"""What ``xover advise`` measures within its budget, planned before the search's first measurement. Pure.

A search costs its llama-bench processes (the defaults, one per candidate value, the defaults again, the kept
values together, and up to :data:`MARGINAL_RESERVE` second processes of a value that leads by a little) and the
confirmation's two llama-server processes; each process costs what the probe of the defaults measured (the
rates at two depths, and the process's own start-up). The plan starts from everything the user asked and, while
it does not fit the budget, shrinks it in this order, saying what each step left out:

1. **fewer depths**: the workload measured at fewer of its representative lengths (the deepest costs most and is
   kept: the representative lengths end at the longest), then, for the default agentic workload only, the band
   halved: the largest depths that fit (on a CPU build an agentic prompt takes minutes); of the ubatches that run
   every prompt left as one ubatch, only the smallest stays;
2. **screening**: each knob whose values one llama-bench process can run and tell apart (``screenable``: its flag
   repeated, its value echoed in the records) has its values measured together in one process, which saves the
   start-up and model load of every value after the first (most of a process on a GPU build of a large model;
   little on a CPU build, where the tests' depths dominate). It is one process's evidence for all of them: a value
   that leads by a little still gets a process of its own, and the confirmation decides;
3. **fewer candidates**: the values the ranking (applicability, then the theory's expected gain) puts lowest
   leave first, down to none: the defaults measured and confirmed alone.

A budget that even the defaults alone at the shallowest band do not fit ends before anything more is measured,
with one line that says what to give.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from xover.analysis.advise.applicability import ubatch_reason
from xover.analysis.advise.knobs import LLAMA_DEFAULT_UBATCH, Knob, with_candidates
from xover.analysis.advise.workload import REPRESENTATIVE_POINTS, Workload
from xover.errors import XoverError

MARGINAL_RESERVE = 2
"""Second processes planned for: a value whose lead is within :data:`CLEAR_MARGIN` of the noise is measured again
(the noise decides how many, up to two a knob; two in all is what a search of the default knobs has mostly needed,
so the plan is an estimate: a search may start a few more processes)."""

MIN_LENGTH = 512  # the band is never halved below llama.cpp's default ubatch


def per_token_s(rates: dict[int, float], depth: float) -> float:
    """Seconds a token costs at ``depth``, from tokens per second measured at two depths: linear in depth between
    and past them (attention reads the whole context), never below the shallower one's."""
    d0, d1 = sorted(rates)[0], sorted(rates)[-1]
    t0, t1 = 1 / rates[d0], 1 / rates[d1]
    return max(t0, t0 + (t1 - t0) * (depth - d0) / max(1, d1 - d0))


def processes(candidates: int, screens: int = 0, screened_values: int = 0) -> int:
    """llama-bench processes a search of ``candidates`` values plans for at one offload level: the defaults, each
    value (``screened_values`` of them in ``screens`` processes, one a knob), the defaults again (the drift), the
    kept values together, and :data:`MARGINAL_RESERVE` second processes (as many as there are values, if fewer)."""
    return 3 + candidates - screened_values + screens + min(MARGINAL_RESERVE, candidates)


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """The search as planned: its workload and representative depths, the knobs with the candidates kept, the
    offload levels, what one process and the confirmation are expected to take, and what was left out."""

    workload: Workload
    points: int  # representative lengths measured (besides depth 0)
    knobs: tuple[Knob, ...]
    levels: int
    per_process_s: float
    confirm_s: float
    budget_s: float
    left_out: tuple[str, ...] = ()
    start_s: float = 0.0  # what a process costs beyond its tests (start-up, model load): what a screen saves
    screened: frozenset[str] = frozenset()  # knobs whose values are measured together in one process

    @property
    def candidates(self) -> int:
        return sum(len(k.candidates) for k in self.knobs)

    def _screens(self) -> list[int]:
        """The values of each screened knob (those with two or more left)."""
        return [len(k.candidates) for k in self.knobs if k.name in self.screened and len(k.candidates) > 1]

    @property
    def processes(self) -> int:
        screens = self._screens()
        return self.levels * processes(self.candidates, len(screens), sum(screens))

    @property
    def seconds(self) -> float:
        screens = self._screens()
        singles = self.processes - self.levels * len(screens)
        tests_s = max(0.0, self.per_process_s - self.start_s)  # one value's tests
        screen_s = sum(self.start_s + n * tests_s for n in screens)
        return singles * self.per_process_s + self.levels * screen_s + self.confirm_s

    @property
    def depths(self) -> tuple[int, ...]:
        return self.workload.depths(self.points)

    def describe(self) -> str:
        values = ", ".join(f"{k.short}={'/'.join(k.candidates)}" for k in self.knobs if k.candidates) or "none"
        text = (
            f"plan: {values}; depths {_tokens(self.depths)}; about {self.processes} llama-bench "
            f"processes of ~{self.per_process_s:.0f} s"
            + (f" and the llama-server confirmation (~{self.confirm_s:.0f} s)" if self.confirm_s else "")
            + f": ~{self.seconds / 60:.1f} min of the --budget {self.budget_s / 60:.1f} min"
        )
        if self.left_out:
            text += "; to fit it: " + "; ".join(self.left_out)
        return text


def plan_search(
    workload: Workload,
    knobs: Sequence[Knob],
    rank: Callable[[Knob, str], float],
    per_process_s: Callable[[Workload, int], float],
    confirm_s: Callable[[Workload, int], float],
    budget_s: float,
    levels: int = 1,
    scalable: bool = False,
    spent_s: float = 0.0,
    start_s: float = 0.0,
    screenable: Callable[[Knob], bool] = lambda knob: False,
) -> SearchPlan:
    """The plan of the module docstring. ``rank(knob, value)``: higher is kept longer; ``per_process_s(workload,
    points)``: one llama-bench process at that workload's representative depths; ``confirm_s(workload, points)``: the
    confirmation at as many representative lengths; ``scalable``: the workload is the default band, which may be halved (a workload the user gave is
    measured as given, at fewer depths at most); ``budget_s``: what is left of the budget after ``spent_s`` (the
    first process, which priced the plan)."""
    given_s, budget_s = budget_s + spent_s, max(0.0, budget_s)
    plan = SearchPlan(
        workload,
        min(REPRESENTATIVE_POINTS, len(workload.lengths)),
        tuple(knobs),
        levels,
        per_process_s(workload, min(REPRESENTATIVE_POINTS, len(workload.lengths))),
        confirm_s(workload, min(REPRESENTATIVE_POINTS, len(workload.lengths))),
        budget_s,
        start_s=start_s,
    )

    def at(w: Workload, points: int) -> SearchPlan:
        return dataclasses.replace(plan, workload=w, points=points, per_process_s=per_process_s(w, points),
                                   confirm_s=confirm_s(w, points))  # fmt: skip

    first = plan
    # 1. fewer depths: fewer representative lengths (time per token is linear in depth: depth 0 and the longest
    # carry it), then (the default band only) the band halved
    while plan.seconds > budget_s and plan.points > 1:
        plan = at(plan.workload, plan.points - 1)
    halved = 0
    while scalable and plan.seconds > budget_s and min(workload.scaled(0.5 ** (halved + 1)).lengths) >= MIN_LENGTH:
        halved += 1
        smaller = workload.scaled(0.5**halved)
        plan = at(smaller, min(plan.points, len(smaller.lengths)))
    if plan.depths != first.depths:
        how = "fewer depths" + (f", the band halved {halved} time(s) to {plan.workload.describe()}" if halved else "")
        plan = dataclasses.replace(
            plan, left_out=(f"depths {_tokens(first.depths)} measured at {_tokens(plan.depths)} ({how})",)
        )
    # ubatches that run every prompt of the band left as one ubatch run the same work: the smallest of them stays
    # (:func:`ubatch_reason`, the tuning stage's rule)
    ub = next((k for k in plan.knobs if k.name == "ubatch-size"), None)
    if ub is not None:
        kept, why = ubatch_reason(ub.candidates, max(plan.workload.lengths), LLAMA_DEFAULT_UBATCH)
        if why is not None:
            plan = dataclasses.replace(plan, knobs=_with(plan.knobs, ub.name, kept), left_out=(*plan.left_out, why))
    # 2. screening: each screenable knob's values in one process
    together = frozenset(k.name for k in plan.knobs if len(k.candidates) > 1 and screenable(k))
    if plan.seconds > budget_s and together:
        plan = dataclasses.replace(plan, screened=together)
        names = ", ".join(f"{k.short}={'/'.join(k.candidates)}" for k in plan.knobs if k.name in together)
        plan = dataclasses.replace(
            plan, left_out=(*plan.left_out, f"{names} screened, each knob's values in one llama-bench process")
        )
    # 3. fewer candidates: the lowest ranked value first (among equal ranks, the later knob's later value)
    ranks = {(k.name, v): rank(k, v) for k in plan.knobs for v in k.candidates}
    dropped: list[str] = []
    while plan.seconds > budget_s and plan.candidates:
        flat = [(k, v) for k in plan.knobs for v in k.candidates]
        i = min(range(len(flat)), key=lambda j: (ranks[flat[j][0].name, flat[j][1]], -j))
        knob, value = flat[i]
        plan = dataclasses.replace(plan, knobs=_with(plan.knobs, knob.name, [v for v in knob.candidates if v != value]))
        dropped.append(f"{knob.short}={value}")
    if dropped:
        plan = dataclasses.replace(plan, left_out=(*plan.left_out, f"values {', '.join(dropped)} (ranked lowest)"))
    if plan.seconds > budget_s:
        spent = f" ({spent_s:.0f} s of it spent on the defaults' first process)" if spent_s else ""
        raise XoverError(
            f"--budget {_duration(given_s)}{spent} cannot hold even llama.cpp's defaults at depths "
            f"{_tokens(plan.depths)} and their confirmation (about {_duration(plan.seconds)} more here): give "
            f"--budget {_minutes((plan.seconds + spent_s) * 1.25)} or more, or shorter --lengths"
        )
    return plan


def _with(knobs: Sequence[Knob], name: str, candidates: Sequence[str]) -> tuple[Knob, ...]:
    """``knobs`` with one knob's candidates replaced, and a knob left with none gone."""
    return tuple(k for k in with_candidates(knobs, name, candidates) if k.candidates)


def _tokens(depths: Sequence[int]) -> str:
    return ", ".join(f"{d:,}" for d in depths)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _minutes(seconds: float) -> str:
    return f"{max(1, -(-int(seconds) // 60))}m"
