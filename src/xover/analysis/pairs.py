"""Which pairs a study's verdicts answer: one rule, read by the study (the pairs whose open questions earn more
rounds of fresh servers) and by the report (the pairs it tells). Pure.

A study answers its headline pairs (the spec's ``pairs``, else its first two configurations) at llama.cpp's
defaults and with each side at its best (its tuned variant, where tuning kept a knob); and, where a configuration
has a variant tuned for the other kind of turn (decode, or cached turns), its best against that variant: the choice
between kinds of work. A study of one configuration and its tuned variant answers that pair: what tuning buys.
Without any tuning it answers the headline pairs once, at the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

# what each told pair is, which the report words (report.html's prefixes)
ONLY, AT_DEFAULTS, AT_BEST, TUNED, FOR_DECODE, FOR_CACHED = "", "defaults", "best", "tuned", "decode", "cached"


def headline(pairs: Sequence[tuple[str, str]], bases: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The spec's pairs (those given), else the first two base configurations: the seed's question."""
    if pairs:
        return tuple(pairs)
    return ((bases[0], bases[1]),) if len(bases) >= 2 else ()


def told_pairs(
    heads: Sequence[tuple[str, str]],
    bases: Sequence[str],
    tuned: Mapping[str, str],
    for_other_kind: Mapping[str, str],
    tuning_ran: bool,
    is_cached: Callable[[str], bool] = lambda name: False,
) -> list[tuple[str, str, str]]:
    """(kind, a, b) for each pair the verdicts answer, in the order they are told: ``tuned`` maps a configuration to
    its tuned variant, ``for_other_kind`` to its variant tuned for decode or (``is_cached``) for cached turns."""
    kinds = [(FOR_CACHED if is_cached(d) else FOR_DECODE, tuned.get(b, b), d) for b, d in for_other_kind.items()]
    if not heads and len(bases) == 1 and bases[0] in tuned:
        return [(TUNED, bases[0], tuned[bases[0]]), *kinds]
    if not tuned and not tuning_ran:
        return [(ONLY, a, b) for a, b in heads]
    out = []
    for a, b in heads:
        out += [(AT_DEFAULTS, a, b), (AT_BEST, tuned.get(a, a), tuned.get(b, b))]
    return out + kinds
