"""Cached agentic turns: the turn tools like Cline and Roo send once a conversation is in llama-server's prompt
cache. Each turn resends the whole conversation; the slot's cache serves its first ``depth`` tokens (``cache_n``
proves it) and only the ``new`` tokens after them are prefilled, then the answer is decoded on top of both.

    turn(new) = TTFT(new @ depth) + R / decode(depth + new)

So for cached turns two configurations cross in *new tokens per turn* at a depth, not in prompt length: a setting
that costs prefill and wins decode (pinned against repacked experts, fewer batch threads) can lose every cold prompt
and win every turn that adds a few thousand tokens. The verdict here reads a :class:`~xover.analysis.crossover.
PairResult` whose lengths are new tokens per turn (:func:`xover.results.read_model.cached_inputs`) under the same
noise rules as the cold verdicts (rounds of fresh servers). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from xover.analysis.crossover import (
    ConfigData,
    PairResult,
    Winner,
    claimed_crossing,
    fitted_outside,
    lengths_span,
    sides,
    split_short,
    winners,
)
from xover.analysis.crossover import tie_note as told_ties
from xover.analysis.rounds import MIN_ROUNDS
from xover.domain.units import format_tokens

_k = format_tokens


def cached_verdict(pair: PairResult, depth: int) -> str:
    """One sentence: who is faster for which turn size on a ``depth``-token cached context, and where they cross in
    new tokens per turn. Within the noise between rounds of fresh servers no winner is named."""
    head = f"{pair.a} vs {pair.b} on cached turns ({_k(depth)}-token context in the cache): "
    s = sides(pair)
    hi = pair.lengths[-1]
    span = f"{lengths_span(pair, 'new tokens')} a turn, {pair.response}-token responses"
    if pair.in_rounds:
        span += f", {pair.rounds_told()} of fresh servers"
    noise = "indistinguishable here" if pair.in_rounds else "within noise"
    if not s.clear and pair.too_few_rounds:
        return head + f"not yet compared ({span}, fewer than the {MIN_ROUNDS} a verdict needs)."
    if not s.clear and pair.short_at:
        settled, short_at = split_short(pair)
        return head + (
            f"{noise} at {settled} and not yet compared at {short_at} new tokens ({span}, fewer than the "
            f"{MIN_ROUNDS} a verdict needs at {short_at})."
        )
    if not s.clear:
        hint = fitted_outside(pair, unit="new tokens", what="turns")
        return head + f"{noise} at every turn size measured ({span}){hint}."
    ties = [_k(pair.lengths[i]) for i in s.ties]
    tie_note = told_ties(pair, s.ties, noise)
    claim = claimed_crossing(pair)
    if not s.changes:
        winner = s.clear[0][1]
        sentence = head + f"{winner} is faster for every turn size {'measured' if not ties else 'where they differ'}"
        sentence += f" ({span}{tie_note})"
        if claim is not None:
            other = pair.b if winner == pair.a else pair.a
            where = "more" if claim.length > hi else "fewer"
            sentence += (
                f"; the fitted cost model has {other} faster for turns of {where} than ~{_k(claim.length)} new "
                f"tokens ({'extrapolated' if claim.extrapolated else 'fitted'})"
            )
        return sentence + "."
    if claim is None:
        runs = ", ".join(f"{w} at {_k(pair.lengths[i])}" for i, w in s.clear)
        return head + f"no consistent winner ({runs}{tie_note}): the order flips more than once."
    short, long_ = s.clear[0][1], s.clear[-1][1]
    ci = f"95% CI {_k(pair.ci[0])}-{_k(pair.ci[1])}; " if pair.ci else ""
    return head + (
        f"{short} is faster for turns of fewer than ~{_k(claim.length)} new tokens and {long_} for more "
        f"({ci}{span}{tie_note})."
    )


def _runs(best: dict[int, Winner], unit: str) -> str:
    """Consecutive lengths with the same answer told together: '1K-4K A, 8K A or B (indistinguishable here), 16K B
    (the only one placed for it)'."""
    groups: list[tuple[list[int], Winner]] = []
    for n, answer in sorted(best.items()):
        if groups and groups[-1][1] == answer:
            groups[-1][0].append(n)
        else:
            groups.append(([n], answer))
    parts = []
    for lengths, w in groups:
        span = _k(lengths[0]) if len(lengths) == 1 else f"{_k(lengths[0])}-{_k(lengths[-1])}"
        short = f"{', '.join(w.unsettled)}: too few rounds to compare" if w.unsettled else ""
        if w.ties:
            who = f"{', '.join([w.best, *w.ties[:-1]])} or {w.ties[-1]} (indistinguishable here{'; ' + short if short else ''})"
        else:
            who = f"{w.best} (the only one placed for it)" if w.alone else w.best
            who += f" ({short})" if short else ""
        parts.append(f"{span}{unit} {who}")
    return ", ".join(parts)


def work_line(cold: Sequence[ConfigData], cached: Sequence[ConfigData], response: int, depth: int) -> str | None:
    """Which configuration to run for which kind of work: per cold prompt length and per cached turn's new tokens,
    the fastest measured there, with every one the noise cannot part from it. None unless two or more configurations measured
    cached turns (a cached answer needs a comparison)."""
    if len(cached) < 2:
        return None
    on_cold = _runs(winners(cold, response), "") if cold else ""
    on_cached = _runs(winners(cached, response), " new tokens")
    head = f"Which to run for which kind of work ({response}-token responses): "
    cold_part = f"cold prompts: {on_cold}; " if on_cold else ""
    return head + cold_part + f"cached turns on a {_k(depth)}-token context: {on_cached}."
