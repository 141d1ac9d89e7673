"""Exact-length, unique prompts; length parsing; fitting text to a token count."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xover.domain.prompts import TextPrompts, TokenPrompts, fit_text, parse_length, parse_lengths, token_pool
from xover.errors import XoverError


@pytest.mark.parametrize(("text", "n"), [("1k", 1024), ("32K", 32768), ("4096", 4096), (" 16k ", 16384), ("1", 1)])
def test_parse_length(text: str, n: int) -> None:
    assert parse_length(text) == n


@pytest.mark.parametrize("text", ["", "1.5k", "k", "-3", "0", "1m", "4 k x"])
def test_parse_length_rejects(text: str) -> None:
    with pytest.raises(XoverError):
        parse_length(text)


def test_parse_lengths() -> None:
    assert parse_lengths("1k,4k,16k,32k") == (1024, 4096, 16384, 32768)
    assert parse_lengths("256, 64") == (64, 256)  # shortest first, whatever the order given
    assert parse_lengths(["1k", 512], "[study] lengths") == (512, 1024)  # a spec's list: the same rule
    with pytest.raises(XoverError, match="repeat"):
        parse_lengths("1k,1024")
    with pytest.raises(XoverError, match=r"\[study\] lengths: length 0 must be at least 1 token"):
        parse_lengths([0], "[study] lengths")
    with pytest.raises(XoverError):
        parse_lengths(",")


def test_token_pool_keeps_ordinary_tokens_only() -> None:
    # NORMAL=1, UNKNOWN=2, CONTROL=3, USER_DEFINED=4, UNUSED=5, BYTE=6
    assert token_pool([3, 1, 1, 2, 4, 5, 6, 1, 3]) == (1, 2, 7)


POOL = tuple(range(10, 60))  # 50 ordinary ids


@given(st.integers(min_value=1, max_value=600), st.integers(min_value=0, max_value=10_000), st.integers(0, 2**31))
def test_token_prompts_have_exact_length_and_pool_ids(length: int, index: int, seed: int) -> None:
    p = TokenPrompts(POOL, seed).make(index, length)
    assert isinstance(p.prompt, tuple) and len(p.prompt) == length == p.length
    assert set(p.prompt) <= set(POOL)


def test_first_token_differs_between_any_two_prompts_up_to_the_pool_size() -> None:
    maker = TokenPrompts(POOL, seed=7)
    firsts = [maker.make(i, 64).prompt[0] for i in range(len(POOL))]
    assert len(set(firsts)) == len(POOL)


def test_first_two_tokens_differ_beyond_the_pool_size() -> None:
    maker = TokenPrompts(POOL, seed=7)
    prefixes = [maker.make(i, 3).prompt[:2] for i in range(len(POOL) ** 2)]
    assert len(set(prefixes)) == len(POOL) ** 2


def test_prompts_are_reproducible_and_seeds_differ() -> None:
    a, b = TokenPrompts(POOL, seed=1), TokenPrompts(POOL, seed=1)
    assert a.make(5, 100) == b.make(5, 100)
    c = TokenPrompts(POOL, seed=2)
    assert c.make(5, 100).prompt != a.make(5, 100).prompt
    assert a.make(5, 100).prompt_id != c.make(5, 100).prompt_id
    assert a.make(5, 100).prompt_id.startswith("ids:s1:i5:")


def test_no_two_prompts_of_a_run_are_equal() -> None:
    # beyond the pool's size (50 here) a prompt needs 2 tokens to stay unique
    maker = TokenPrompts(POOL, seed=3)
    prompts = [maker.make(i, L).prompt for i, L in zip(range(500), itertools.cycle([2, 3, 64, 256]))]
    assert len(set(prompts)) == len(prompts)


def test_pool_too_small() -> None:
    with pytest.raises(XoverError):
        TokenPrompts([5, 5], seed=0)


def _counter(per_char: int = 1, bos: int = 1):  # type: ignore[no-untyped-def]
    """A fake tokenizer count: BOS plus one token per word and one per punctuation mark."""

    async def count(text: str) -> int:
        return bos + len(text.replace(".", " .").split()) * per_char

    return count


@pytest.mark.parametrize("length", [2, 3, 17, 100, 1000])
def test_fit_text_hits_the_length_exactly(length: int) -> None:
    maker = TextPrompts(seed=4)
    count = _counter()
    p = asyncio.run(maker.make(9, length, count))
    assert isinstance(p.prompt, str)
    assert asyncio.run(count(p.prompt)) == length
    assert p.prompt_id.startswith("text:s4:i9:")


def test_text_prompts_start_differently() -> None:
    maker = TextPrompts(seed=4)
    firsts = {maker.draft(i, 10).split()[0] for i in range(50)}
    assert len(firsts) == 50


def test_fit_text_fails_clearly_when_no_cut_matches() -> None:
    # every word is two tokens: odd lengths cannot be hit
    with pytest.raises(XoverError, match="drop --text"):
        asyncio.run(fit_text(lambda n: " ".join(["word"] * n), 7, _counter(per_char=2, bos=0)))


def _byte_vocab(bos: int = 0, merges: tuple[str, ...] = (" t",)):  # type: ignore[no-untyped-def]
    """The count of xover's synthetic vocabulary (tiny-moe): one token per UTF-8 byte, each merge's
    pair one token (merged left to right, as BPE does with a single merge), BOS where the model adds one."""

    async def count(text: str) -> int:
        n = len(text.encode())
        for m in merges:
            n -= text.count(m) * (len(m.encode()) - 1)
        return bos + n

    return count


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), index=st.integers(0, 500), length=st.integers(2, 400), bos=st.sampled_from([0, 1]))
def test_text_prompts_reach_every_length_on_a_byte_vocabulary(seed: int, index: int, length: int, bos: int) -> None:
    """Issue 18: a cut just after a space used to be stripped to one token short, with no longer cut tried."""
    count = _byte_vocab(bos)
    p = asyncio.run(TextPrompts(seed).make(index, length, count))
    assert asyncio.run(count(p.prompt)) == length


def test_a_cut_after_a_space_is_completed() -> None:
    # the draft "aa bb cc ..." cut at 3 bytes is "aa " (3 tokens); "aa" is 2 and "aa b" is 4
    count = _byte_vocab()
    text = asyncio.run(fit_text(lambda n: " ".join(["aa", "bb", "cc", "dd"] * n), 3, count))
    assert asyncio.run(count(text)) == 3 and text.startswith("aa")


@given(length=st.integers(2, 300), seed=st.integers(0, 10_000))
@settings(max_examples=100, deadline=None)
def test_text_prompts_reach_every_length_when_words_merge(length: int, seed: int) -> None:
    """A vocabulary where common pieces merge (so many cuts skip a count) still gets every length."""
    count = _byte_vocab(1, merges=("the", "ti", " s", "er", "on", " c", "ea"))
    p = asyncio.run(TextPrompts(seed).make(seed % 97, length, count))
    assert asyncio.run(count(p.prompt)) == length
