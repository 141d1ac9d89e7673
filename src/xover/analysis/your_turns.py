"""Your own turns: a recorded workload summarized, sized into a study, and answered in minutes of waiting. Pure.

A recording (``xover record``, full, shape-only or from a server's log) holds per turn the prompt's tokens, the
prefix the user's server took from its cache and the answer's tokens. A study of it measures what those turns need
(:func:`study_sizes`): cold prompts over the range their contexts reach, cached turns of their typical new tokens on
their typical depth, answers of their typical length.

The answer is each configuration's waiting over the recorded turns, from its measured cost model
(:class:`~xover.analysis.crossover.CostModel`, fitted per round of fresh servers to that round's cold TTFT and decode
speeds): a turn that adds ``n`` tokens to a cached prefix of ``d`` waits for the prefill of positions ``d`` to
``d + n`` (the model's ``a + b n + c ((d + n)^2 - d^2)``: the fixed cost, the tokens, their attention over the
whole context) and for its answer decoded on top of ``d + n`` tokens. Summed per round, the rounds pair two
configurations, and the difference's 95% Student-t interval over them says whether one saves the user time
(:func:`saving`). The replay of the recording on each configuration's real server checks the prediction
(:func:`replay_check`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xover.analysis.crossover import ConfigData, CostModel, fit_cost_model
from xover.analysis.rounds import MIN_ROUNDS, paired_difference
from xover.domain.units import format_wait

MIN_LENGTHS = 3  # the cost model's quadratic term needs three distinct lengths
ROUND_TO = 256  # measured lengths are rounded up to this many tokens


@dataclasses.dataclass(frozen=True)
class RecordedTurn:
    prompt: int  # the whole prompt, in the recording server's tokens
    cached: int  # its prefix from the server's cache
    answer: int

    @property
    def new(self) -> int:
        return max(self.prompt - self.cached, 0)


def recorded_turns(recorded: Iterable[Mapping[str, Any] | None]) -> list[RecordedTurn]:
    """The turns of a recording's ``recorded`` objects (one per turn); turns without a prompt count are left out."""
    out = []
    for r in recorded:
        if not r or not isinstance(r.get("prompt_tokens"), int) or r["prompt_tokens"] <= 0:
            continue
        cached, answer = r.get("cached_tokens"), r.get("answer_tokens")
        cached = cached if isinstance(cached, int) else 0
        answer = answer if isinstance(answer, int) else 0
        out.append(RecordedTurn(r["prompt_tokens"], min(max(cached, 0), r["prompt_tokens"]), max(answer, 0)))
    return out


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1) by linear interpolation between order statistics."""
    s = sorted(xs)
    if not s:
        raise ValueError("no values")
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One measure of the turns: its median, 90th percentile and range."""

    median: float
    p90: float
    low: float
    high: float


def distribution(xs: Sequence[float]) -> Distribution:
    return Distribution(statistics.median(xs), quantile(xs, 0.9), min(xs), max(xs))


@dataclasses.dataclass(frozen=True)
class Summary:
    turns: int
    cold: int  # turns with nothing from the cache
    new: Distribution  # new tokens per turn
    depth: Distribution  # the cached prefix
    prompt: Distribution
    answer: Distribution


def summarize(turns: Sequence[RecordedTurn]) -> Summary:
    if not turns:
        raise ValueError("no recorded turns with a prompt count")
    return Summary(
        len(turns),
        sum(t.cached == 0 for t in turns),
        distribution([t.new for t in turns]),
        distribution([t.cached for t in turns]),
        distribution([t.prompt for t in turns]),
        distribution([t.answer for t in turns]),
    )


@dataclasses.dataclass(frozen=True)
class StudySizes:
    lengths: tuple[int, ...]  # cold prompts: the range the turns' contexts reach
    cached_new_tokens: tuple[int, ...]  # cached turns: the typical and the large new tokens
    cached_depth: int | None  # on the typical cached prefix; None when no turn was served from a cache
    response_tokens: int  # the typical answer


def _up(n: float) -> int:
    return max(ROUND_TO, math.ceil(n / ROUND_TO) * ROUND_TO)


def study_sizes(turns: Sequence[RecordedTurn]) -> StudySizes:
    """What a study of ``turns`` measures: cold prompts at the shortest, median and longest context (rounded up to
    256 tokens; halves of the longest added until there are three distinct lengths, which the cost model's
    quadratic term needs), cached turns of the median and 90th-percentile new tokens on the median cached prefix,
    answers of the median length."""
    s = summarize(turns)
    lengths = {_up(s.prompt.low), _up(s.prompt.median), _up(s.prompt.high)}
    longest = max(lengths)
    k = 2
    while len(lengths) < MIN_LENGTHS:  # halves of the longest; past it where a context is too short to halve
        lengths.add(_up(longest / k) if longest / k >= ROUND_TO else _up(longest * k))
        k *= 2
    cached = [t for t in turns if t.cached > 0]
    if cached:
        sizes = tuple(sorted({_up(statistics.median([t.new for t in cached])),
                              _up(quantile([t.new for t in cached], 0.9))}))  # fmt: skip
        depth: int | None = _up(statistics.median([t.cached for t in cached]))
    else:
        sizes, depth = (), None
    return StudySizes(tuple(sorted(lengths)), sizes, depth, max(1, round(s.answer.median)))


def turn_wait(model: CostModel, turn: RecordedTurn) -> float:
    """Seconds the user waits for ``turn``: the prefill of its new tokens on top of its cached prefix, then its
    answer decoded on top of the whole prompt."""
    d, p = turn.cached, turn.prompt
    prefill = model.a + model.b * (p - d) + model.c * (p * p - d * d)
    return max(prefill, 0.0) + model.decode_s(p, turn.answer)


def round_models(config: ConfigData) -> dict[int, CostModel]:
    """Round -> the cost model fitted to that round's medians (cold TTFT per length, decode speed per length)."""
    by_round: dict[int, tuple[dict[int, list[float]], dict[int, list[float]]]] = {}
    for length, rounds in config.rounds.items():
        for r, (ttft, decode) in rounds.items():
            t, d = by_round.setdefault(r, ({}, {}))
            t[length] = [ttft]
            d[length] = [decode]
    return {r: fit_cost_model(ConfigData(config.label, t, d)) for r, (t, d) in sorted(by_round.items())}


def waiting(models: Mapping[int, CostModel], turns: Sequence[RecordedTurn]) -> dict[int, float]:
    """Round -> seconds waited over all ``turns``."""
    return {r: sum(turn_wait(m, t) for t in turns) for r, m in models.items()}


@dataclasses.dataclass(frozen=True)
class Saving:
    a: str
    b: str
    turns: int  # recorded turns the seconds are over
    a_s: float  # median over rounds of the seconds waited
    b_s: float
    diff_s: float  # mean over the paired rounds of a's seconds less b's
    low_s: float  # 95% Student-t interval of that difference
    high_s: float
    rounds: int

    @property
    def separated(self) -> int:
        """-1 when ``a`` keeps the user waiting less beyond the noise between rounds, +1 when ``b`` does, 0 else (or
        with fewer rounds than a verdict needs)."""
        if self.rounds < MIN_ROUNDS:
            return 0
        return -1 if self.high_s < 0 else 1 if self.low_s > 0 else 0


def saving(a: str, wait_a: Mapping[int, float], b: str, wait_b: Mapping[int, float], turns: int) -> Saving | None:
    """``a`` against ``b`` over the rounds both were measured in; None with fewer than two such rounds."""
    interval = paired_difference(wait_a, wait_b)
    if interval is None:
        return None
    mean, low, high, n = interval
    shared = sorted(set(wait_a) & set(wait_b))
    return Saving(a, b, turns, statistics.median(wait_a[r] for r in shared),
                  statistics.median(wait_b[r] for r in shared), mean, low, high, n)  # fmt: skip


def saving_line(s: Saving) -> str:
    """The verdict in the user's time."""
    head = (
        f"Over your {s.turns} recorded turns, {s.a} would have kept you waiting {format_wait(s.a_s)} and {s.b} "
        f"{format_wait(s.b_s)}"
    )
    if s.separated == 0 and s.rounds < MIN_ROUNDS:
        return (
            f"{head}: not yet compared ({s.rounds} rounds of fresh servers, fewer than the {MIN_ROUNDS} a verdict "
            f"needs; {s.b if s.diff_s > 0 else s.a} ahead by {format_wait(abs(s.diff_s))} so far)."
        )
    if s.separated == 0:
        return (
            f"{head}: indistinguishable here (the difference, {format_wait(s.diff_s)}, is within the noise between "
            f"{s.rounds} rounds of fresh servers: 95% interval {format_wait(s.low_s)} to {format_wait(s.high_s)})."
        )
    winner, loser = (s.a, s.b) if s.separated < 0 else (s.b, s.a)
    lo, hi = sorted((abs(s.low_s), abs(s.high_s)))
    return (
        f"{head}; {winner} saves {format_wait(abs(s.diff_s))} against {loser} (95% interval {format_wait(lo)} to "
        f"{format_wait(hi)}, {s.rounds} rounds of fresh servers)."
    )


@dataclasses.dataclass(frozen=True)
class ReplayCheck:
    label: str
    turns: int
    measured_s: float  # the replay's waiting: each turn's TTFT and its answer's decode, summed
    predicted_s: float  # the cost model (all rounds' samples) over the same turns

    @property
    def off(self) -> float:
        return self.predicted_s / self.measured_s - 1 if self.measured_s > 0 else math.nan


def replay_check(label: str, model: CostModel, replayed: Sequence[tuple[RecordedTurn, float]]) -> ReplayCheck:
    """The prediction for the turns as the replay sent them (``(turn, seconds waited)``: the replaying server's
    prompt, cached prefix and answer tokens) against what the replay measured."""
    return ReplayCheck(label, len(replayed), sum(w for _, w in replayed), sum(turn_wait(model, t) for t, _ in replayed))
