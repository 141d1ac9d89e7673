"""Chat-shaped prompts of an exact length: what an agent sends, cut to L tokens. Pure (the tokenizer is supplied).

Agents send ``/v1/chat/completions`` with many messages (a long system prompt, tool results, user and assistant
turns), not one token array. A chat prompt of length L is the last turn of a session from xover's agentic session
generator (:func:`xover.domain.workload.generate`), with about :data:`MESSAGES_PER_1K` messages per 1,024 tokens, that
the server evaluates as exactly L tokens once its chat template is applied (``prompt_n == L`` on a cold request):

1. the session is generated with as many turns as the message count asks (a turn adds an assistant and a user
   message), long enough, and each message is tokenized;
2. every message after the system prompt is cut to its share of what the template's own tokens and the system prompt
   (at most a quarter of L) leave, its first tokens kept, so the number of messages stays what was asked (the
   generator's turns hold at least 1,500 characters each, and a synthetic vocabulary takes more tokens per character
   than a real one);
3. the last message is then trimmed or padded with ordinary tokens until the template's count is exactly L.

Unique per sample: the generator's seed is the prompt's index under the run's seed, and the last message opens with
tokens chosen by the index (as :class:`xover.domain.prompts.TokenPrompts` does), so no two prompts of a run share
more than the template's opening and what the generator repeats in every system prompt.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any, Protocol

from xover.domain.prompts import Prompt, content_hash
from xover.domain.workload import WorkloadSpec, generate, messages_for_turn
from xover.errors import XoverError

MESSAGES_PER_1K = 3.0
"""Chat messages per 1,024 prompt tokens: 48 at 16K, 96 at 32K (the hand measurements behind issue 66 sent 32 and 96
per 16K; a Cline session's turns carry one tool result and one reply each)."""

MIN_MESSAGE_TOKENS = 4  # each cut message keeps at least this many tokens
FIT_ATTEMPTS = 8  # trims and pads of the last message before giving up


class ChatTokenizer(Protocol):
    """What making a chat prompt asks of the server that will evaluate it."""

    async def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]: ...

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    async def detokenize(self, tokens: Sequence[int]) -> str: ...


@dataclasses.dataclass(frozen=True)
class ChatPrompt(Prompt):
    """A chat prompt: ``messages`` are what is sent; ``prompt`` is their text as the template renders it is not
    kept (the server renders it), so it holds ``""``; ``length`` is the tokens the server evaluates."""

    messages: tuple[dict[str, Any], ...] = ()


def turns_for(length: int, per_1k: float = MESSAGES_PER_1K) -> int:
    """The generated session's turns for a prompt of ``length`` tokens: a turn adds two messages."""
    return max(2, round(per_1k * length / 1024 / 2))


def cut_shares(sizes: Sequence[int], room: int) -> list[int]:
    """How many tokens each message after the first keeps when they share ``room`` tokens: each its size scaled by
    the same share (at most 1), at least :data:`MIN_MESSAGE_TOKENS` (or its size, if smaller)."""
    total = sum(sizes)
    share = min(1.0, room / total) if total > 0 else 1.0
    return [min(n, max(MIN_MESSAGE_TOKENS, math.floor(n * share))) for n in sizes]


class ChatPrompts:
    """Chat prompts under ``seed``, their lead tokens drawn from ``pool`` (the model's ordinary token ids)."""

    def __init__(self, pool: Sequence[int], seed: int, per_1k: float = MESSAGES_PER_1K) -> None:
        if len(pool) < 2:
            raise XoverError("the model's vocabulary has fewer than 2 ordinary tokens to build prompts from")
        self.pool = tuple(sorted(set(pool)))
        self.seed = seed
        self.per_1k = per_1k

    async def make(self, index: int, length: int, tok: ChatTokenizer) -> ChatPrompt:
        """Prompt ``index`` of exactly ``length`` tokens as the server counts them (see the module's doc)."""
        turns = turns_for(length, self.per_1k)
        system = max(64, min(10_240, length // 4))
        spec = WorkloadSpec(
            seed=self.seed * 1_000_003 + index,
            turns=turns,
            system_tokens=system,
            target_tokens=max(length, system + 64 * turns + 1),
        )
        session = generate(spec)
        messages = messages_for_turn(session, len(session.turns) - 1, None)
        ids = [await tok.tokenize(str(m["content"]), add_special=False) for m in messages]
        framing = len(await tok.prompt_tokens(messages)) - sum(map(len, ids))  # the template's own tokens
        rng = random.Random(f"chat:{self.seed}:{index}")
        lead = [self.pool[index % len(self.pool)], *rng.choices(self.pool, k=3)]
        keep_system = min(len(ids[0]), system)
        room = length - framing - keep_system - len(lead)
        if room < MIN_MESSAGE_TOKENS * (len(messages) - 1):
            raise XoverError(
                f"a chat prompt of {length:,} tokens cannot hold {len(messages)} messages and the template's "
                f"{framing} tokens: give a longer length"
            )
        cut = [ids[0][:keep_system], *(t[:k] for t, k in zip(ids[1:], cut_shares([len(t) for t in ids[1:]], room)))]
        cut[-1] = lead + cut[-1]
        texts = [await tok.detokenize(t) for t in cut]
        return await self._fit(index, length, messages, texts, rng, tok)

    async def _fit(
        self,
        index: int,
        length: int,
        messages: Sequence[dict[str, Any]],
        texts: list[str],
        rng: random.Random,
        tok: ChatTokenizer,
    ) -> ChatPrompt:
        """Trim or pad the last message until the template's count is ``length``."""

        def shaped() -> list[dict[str, Any]]:
            return [dict(m, content=t) for m, t in zip(messages, texts)]

        n = -1
        for _ in range(FIT_ATTEMPTS):
            n = len(await tok.prompt_tokens(shaped()))
            if n == length:
                msgs = tuple(shaped())
                return ChatPrompt(
                    prompt="",
                    length=length,
                    prompt_id=f"chat:s{self.seed}:i{index}:{content_hash(repr(msgs))}",
                    messages=msgs,
                )
            last = await tok.tokenize(texts[-1], add_special=False)
            if n > length:
                texts[-1] = await tok.detokenize(last[: max(1, len(last) - (n - length))])
            else:
                texts[-1] = await tok.detokenize([*last, *rng.choices(self.pool, k=length - n)])
        raise XoverError(f"could not make a chat prompt of exactly {length:,} tokens (the template gave {n:,})")
