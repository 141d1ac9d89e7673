"""Chat-shaped prompts of an exact length (issue 66), on a tokenizer with a known answer: one token per
whitespace-separated word, a template that adds 3 tokens per message and 1 to open the reply."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from xover.analysis.crossover import ConfigData
from xover.analysis.prompt_shape import pair_by_shape, shape_effects, summary
from xover.domain.chat_prompts import MIN_MESSAGE_TOKENS, ChatPrompts, cut_shares, turns_for
from xover.errors import XoverError

PER_MESSAGE, REPLY = 3, 1


class WordTokenizer:
    """Each word is one token; ids are indexes into a growing vocabulary, so detokenize(tokenize(t)) is t's words."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def _id(self, w: str) -> int:
        if w not in self.vocab:
            self.vocab[w] = len(self.words)
            self.words.append(w)
        return self.vocab[w]

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return [self._id(w) for w in text.split()]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return " ".join(self.words[t] if t < len(self.words) else f"w{t}" for t in tokens)

    async def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [0] * PER_MESSAGE + await self.tokenize(str(m["content"]))
        return ids + [0] * REPLY


def _make(length: int, index: int = 0, seed: int = 7) -> tuple[Any, WordTokenizer]:
    tok = WordTokenizer()
    pool = list(range(5000, 6000))
    return asyncio.run(ChatPrompts(pool, seed).make(index, length, tok)), tok


@pytest.mark.parametrize("length", [1024, 4096, 16384])
def test_a_chat_prompt_is_exactly_its_length_in_the_servers_count(length: int) -> None:
    p, tok = _make(length)
    assert p.length == length
    assert len(asyncio.run(tok.prompt_tokens(list(p.messages)))) == length
    # the messages an agent sends: a system prompt first, then user and assistant turns, as many as asked
    roles = [m["role"] for m in p.messages]
    assert roles[0] == "system" and roles[1] == "user" and len(roles) == 2 * turns_for(length)
    assert set(roles[2:]) == {"user", "assistant"}
    assert all(len(str(m["content"]).split()) >= 1 for m in p.messages)


def test_prompts_of_a_run_differ_and_repeat_under_the_same_seed() -> None:
    a, _ = _make(4096, index=1)
    b, _ = _make(4096, index=2)
    again, _ = _make(4096, index=1)
    assert a.prompt_id != b.prompt_id and a.messages[-1]["content"] != b.messages[-1]["content"]
    assert again.messages == a.messages and again.prompt_id == a.prompt_id


def test_a_length_too_short_for_its_messages_is_refused_in_one_line() -> None:
    with pytest.raises(XoverError, match="cannot hold .* messages"):
        _make(64)


def test_cut_shares_keep_every_message_and_their_proportions() -> None:
    assert cut_shares([100, 300], 200) == [50, 150]
    assert cut_shares([100, 300], 1000) == [100, 300]  # room to spare: nothing cut
    assert cut_shares([2, 1000], 100) == [2, 99]  # a message shorter than the minimum stays whole
    assert min(cut_shares([50, 50, 50], 6)) == MIN_MESSAGE_TOKENS


def _data(label: str, length: int, per_round: dict[int, float]) -> ConfigData:
    return ConfigData(
        label,
        {length: list(per_round.values())},
        {length: [50.0] * len(per_round)},
        rounds={length: {r: (t, 50.0) for r, t in per_round.items()}},
    )


def test_chat_slower_beyond_the_noise_between_servers_is_called_and_noise_is_not() -> None:
    blob = [_data("gpu", 16384, {1: 1.00, 2: 1.10, 3: 0.95}), _data("cpu", 16384, {1: 2.0, 2: 2.2, 3: 1.9})]
    # gpu: chat 8% slower in every server (the servers themselves differ by 15%); cpu: chat +-3%, no direction
    chat = [_data("gpu", 16384, {1: 1.08, 2: 1.188, 3: 1.026}), _data("cpu", 16384, {1: 2.06, 2: 2.134, 3: 1.957})]
    effects = {e.config: e for e in shape_effects(blob, chat)}
    assert effects["gpu"].differs and effects["gpu"].interval is not None
    assert effects["gpu"].interval.ratio == pytest.approx(1.08)
    assert "slower as chat" in effects["gpu"].describe()
    assert not effects["cpu"].differs and "indistinguishable here" in effects["cpu"].describe()
    assert "1.08x" in summary(list(effects.values())) and "gpu" in summary(list(effects.values()))
    # the penalty of the second placement over the first, in each shape
    as_blob, as_chat = pair_by_shape("gpu", "cpu", {c.label: c for c in blob}, {c.label: c for c in chat}, 16384)
    assert as_blob is not None and as_chat is not None and as_chat.ratio < as_blob.ratio


def test_two_rounds_are_not_yet_a_comparison() -> None:
    effects = shape_effects([_data("a", 4096, {1: 1.0, 2: 1.0})], [_data("a", 4096, {1: 2.0, 2: 2.0})])
    assert not effects[0].differs and "not yet compared" in effects[0].describe()
    assert "not yet compared" in summary(effects)
