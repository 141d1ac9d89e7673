"""advise's workload: a distribution of turns (prompt and response tokens, weight), the agentic default,
the workload file, and fitting a workload to a measurement budget. Pure."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Sequence

from xover.domain.units import format_tokens
from xover.errors import XoverError

AGENTIC_LENGTHS = (10_240, 20_480, 30_720, 40_960)  # the agentic band, 10K-40K (K = 1024)
REPRESENTATIVE_POINTS = 4  # measured depths besides 0


@dataclasses.dataclass(frozen=True)
class Turn:
    length: int  # prompt tokens (a cached turn: its new tokens, prefilled after ``cached``)
    response: int  # generated tokens
    weight: float = 1.0
    cached: int = 0  # tokens the prompt cache already holds (a cached agentic turn); 0: a cold prompt


@dataclasses.dataclass(frozen=True)
class Workload:
    """A distribution of turns; :meth:`expected` weighs a per-turn cost over it."""

    name: str
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not self.turns:
            raise XoverError("a workload needs at least one turn: give --lengths or a --workload file with lines")
        if any(t.length < 1 or t.response < 1 or not t.weight > 0 for t in self.turns):
            raise XoverError("workload turns need a prompt and a response of at least 1 token and a positive weight")

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sorted({t.length for t in self.turns}))

    @property
    def mean_response(self) -> float:
        return sum(t.response * t.weight for t in self.turns) / sum(t.weight for t in self.turns)

    def representative(self, points: int = REPRESENTATIVE_POINTS) -> tuple[int, ...]:
        """The lengths to measure at: all of them when few, else weighted quantiles ending at the longest."""
        if len(self.lengths) <= points:
            return self.lengths
        turns = sorted(self.turns, key=lambda t: t.length)
        total = sum(t.weight for t in turns)
        cum = list(itertools.accumulate(t.weight for t in turns))
        picks = [
            next(t.length for t, c in zip(turns, cum) if c >= total * (i + 1) / points - 1e-9) for i in range(points)
        ]
        return tuple(sorted(set(picks)))

    def depths(self, points: int = REPRESENTATIVE_POINTS) -> tuple[int, ...]:
        return (0, *self.representative(points))

    def expected(self, cost: Callable[[Turn], float]) -> float:
        return sum(cost(t) * t.weight for t in self.turns) / sum(t.weight for t in self.turns)

    def scaled(self, factor: float, unit: int = 256) -> Workload:
        """Every length times ``factor``, rounded to ``unit`` tokens (at least one unit)."""
        turns = tuple(
            dataclasses.replace(t, length=max(unit, round(t.length * factor / unit) * unit)) for t in self.turns
        )
        return Workload(self.name, turns)

    def describe(self) -> str:
        lengths = self.lengths
        shown = ", ".join(format_tokens(L) for L in lengths[:6]) + (
            f" ... ({len(lengths)} lengths)" if len(lengths) > 6 else ""
        )
        uniform = len({t.weight for t in self.turns}) == 1 and len(self.turns) == len(lengths)
        resp = {t.response for t in self.turns}
        response = (
            f"{resp.pop()}-token responses"
            if len(resp) == 1
            else f"responses of {self.mean_response:.0f} tokens on average"
        )
        return f"{self.name}: {'uniform over' if uniform else 'prompts of'} {shown} tokens, {response}"


def uniform_workload(lengths: Sequence[int], response: int, name: str = "lengths") -> Workload:
    return Workload(name, tuple(Turn(L, response) for L in sorted(set(lengths))))


def cached_workload(new_tokens: Sequence[int], depth: int, response: int) -> Workload:
    """Cached agentic turns, uniform over ``new_tokens`` new tokens each on a ``depth``-token cached context."""
    return Workload(
        f"cached turns on {format_tokens(depth)}",
        tuple(Turn(n, response, cached=depth) for n in sorted(set(new_tokens))),
    )


def agentic_workload(response: int) -> Workload:
    """The default: agentic turns, prompts uniform over the 10K-40K band."""
    return uniform_workload(AGENTIC_LENGTHS, response, "agentic")


_TOKENS = re.compile(r"(\d+)\s*([kK]?)")


def _tokens(text: str, where: str) -> int:
    m = _TOKENS.fullmatch(text.strip())
    if not m:
        raise XoverError(f"{where}: {text.strip()!r} is not a token count (e.g. 4096 or 4k)")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def parse_workload(text: str, response: int, name: str) -> Workload:
    """A workload file: one turn per line, ``PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]]`` (``#`` comments);
    e.g. the prompt lengths of a real session's turns. A missing response is ``response``."""
    turns = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p for p in re.split(r"[,\s]+", line) if p]
        where = f"{name} line {number}"
        if len(parts) > 3:
            raise XoverError(f"{where}: write PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]], got {line!r}")
        length = _tokens(parts[0], where)
        resp = _tokens(parts[1], where) if len(parts) > 1 else response
        try:
            weight = float(parts[2]) if len(parts) > 2 else 1.0
        except ValueError:
            raise XoverError(f"{where}: weight {parts[2]!r} is not a number") from None
        turns.append(Turn(length, resp, weight))
    if not turns:
        raise XoverError(f"{name} has no turns: write one PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]] per line")
    return Workload(name, tuple(turns))


def measurement_seconds(
    depths: Sequence[int], chunk: int, n_gen: int, repetitions: int, pp_tps: float, tg_tps: float
) -> float:
    """Rough wall time of one measurement from a shallow probe's speeds: both tests at a depth prefill
    it once (counted at half the probe's speed: attention slows deep prefill), warm up, then repeat."""
    return sum(2 * 2 * d / pp_tps + (repetitions + 1) * (chunk / pp_tps + n_gen / tg_tps) for d in depths)
