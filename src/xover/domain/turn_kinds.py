"""The kinds of turn a study measures on its fresh servers, one entry each. Pure.

A kind of turn is what a request asks of a server: a **cold** prompt (the whole prompt prefilled, nothing cached),
the same sent as **chat** (many messages, as agents send them; one length per configuration, beside the cold prompt of
that length, so that the report can say whether the shape changes the rate), or a **cached** agentic turn (new tokens after a context the slot's cache already holds, as Cline and Roo send once
a session is under way). Each entry says which ``[study]`` keys ask for it, how many tokens per turn it measures on
a configuration, what the cache holds before each turn, and the ``mode`` its samples are stored under. The layers
above hold one function per kind, keyed by its name, and a test checks that every kind has each of them:

- ``results.read_model.TURN_INPUTS``: its samples as the crossover's inputs (per configuration and size, per round);
- ``report.html.TURN_SECTIONS``: the report's section that tells it.

The cold stage (``measure.cold``) plans, resumes and measures every kind on the same fresh servers: the cold samples
first (a cached turn's priming would otherwise leave a context in the slot), then each other kind in this order;
a round past the first ones measures only the sizes whose questions are still open, kind by kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from xover.domain.config import LlamaConfig
from xover.domain.records import CHAT_MODE, TTFT_MODES, cached_depth, cached_mode
from xover.domain.study_spec import StudySpec


@dataclasses.dataclass(frozen=True)
class TurnKind:
    """One kind of turn: its name (the key of the per-layer functions), the ``[study]`` keys that ask for it, the
    tokens per turn it measures on a configuration (``sizes``), the context cached before each turn (``depth``; None:
    the spec measures none of this kind), and the stored ``mode`` of its samples at that depth."""

    name: str
    title: str
    spec_keys: tuple[str, ...]
    sizes: Callable[[StudySpec, LlamaConfig], tuple[int, ...]]
    depth: Callable[[StudySpec], int | None]
    mode: Callable[[int], str]
    owns: Callable[[str], bool]
    chat: bool = False  # sent as chat messages (xover.domain.chat_prompts), not one token array

    def wanted(self, spec: StudySpec, config: LlamaConfig) -> tuple[int, ...]:
        """The sizes ``spec`` measures of this kind on ``config``: none where the spec asks for none."""
        return self.sizes(spec, config) if self.depth(spec) is not None else ()


COLD = TurnKind(
    name="cold",
    title="Cold prompts",
    spec_keys=("lengths",),
    sizes=lambda spec, config: spec.lengths_for(config),
    depth=lambda spec: 0,
    mode=lambda depth: TTFT_MODES[0],
    owns=lambda mode: mode == TTFT_MODES[0],
)

CHAT = TurnKind(
    name="chat",
    title="Chat-shaped prompts",
    spec_keys=("chat-length",),
    sizes=lambda spec, config: spec.chat_lengths_for(config),
    depth=lambda spec: 0 if spec.chat_length != 0 else None,
    mode=lambda depth: CHAT_MODE,
    owns=lambda mode: mode == CHAT_MODE,
    chat=True,
)

CACHED = TurnKind(
    name="cached",
    title="Cached agentic turns",
    spec_keys=("cached-turns", "cached-depth"),
    sizes=lambda spec, config: spec.cached_turns_for(config),
    depth=lambda spec: spec.turns_depth,
    mode=cached_mode,
    owns=lambda mode: cached_depth(mode) is not None,
)

TURN_KINDS: tuple[TurnKind, ...] = (COLD, CHAT, CACHED)
"""Every kind, in the order a server measures them."""

AFTER_COLD: tuple[TurnKind, ...] = TURN_KINDS[1:]
"""The kinds measured on a round's server after its cold samples."""


def kind_of(mode: str) -> TurnKind | None:
    """The kind whose samples are stored under ``mode``; None for a mode no study kind owns (warm, cache lab)."""
    return next((k for k in TURN_KINDS if k.owns(mode)), None)


def by_name(name: str) -> TurnKind:
    found = next((k for k in TURN_KINDS if k.name == name), None)
    if found is None:
        raise KeyError(f"no turn kind {name!r}: one of {', '.join(k.name for k in TURN_KINDS)}")
    return found
