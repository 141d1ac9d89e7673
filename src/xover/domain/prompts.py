"""Prompts of an exact length, unique per sample. Pure (text fitting takes the counter as a function).

**What L means.** A prompt of length L is one the server evaluates as exactly L tokens on a cold
request, so a cold sample must report ``prompt_n == L`` and ``cache_n == 0``:

* token-id prompts (the default) are lists of exactly L ids. llama-server adds BOS only to a
  prompt that is a string or starts with one, never to a list of ids, so L ids are L tokens
  (checked on the real server by the real-tier tests);
* text prompts (``--text``) are cut so that the server's ``/tokenize`` with ``add_special`` (what
  ``/completion`` applies to text) returns L tokens: BOS, where the model adds one, is one of them.

**Unique.** Prompt ``index`` of a run starts with a token chosen by ``index`` from a per-seed
permutation of the pool, so the first token already differs between any two prompts of a run (up
to the pool's size; beyond it the first two tokens differ). The rest is drawn from a generator
seeded by ``(seed, index)``. A different seed per run keeps runs apart on a long-lived server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Awaitable, Callable, Sequence

from xover.errors import XoverError

NORMAL_TOKEN = 1  # GGUF tokenizer.ggml.token_type for an ordinary token (gguf.TokenType.NORMAL)

_LENGTH = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


def parse_tokens(value: str | int, what: str = "prompt length", minimum: int = 1) -> int:
    """A token count: ``1k`` / ``32K`` (K = 1024 tokens, as context sizes are counted), a plain ``4096``, or an
    integer; at least ``minimum``. A one-line error names ``what``."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _LENGTH.match(value) if isinstance(value, str) else None
        if not m:
            raise XoverError(f"{what} {value!r} is not a number of tokens: write e.g. 1k, 4096 or 32K")
        n = int(m.group(1)) * (1024 if m.group(2) else 1)
    if n < minimum:
        raise XoverError(f"{what} {value!r} must be at least {minimum} token{'s' if minimum != 1 else ''}")
    return n


def parse_length(text: str | int) -> int:
    """A prompt length: ``1k`` / ``32K`` (K = 1024 tokens) or a plain ``4096``, at least 1 token."""
    return parse_tokens(text)


def parse_lengths(value: str | Sequence[str | int], what: str = "--lengths") -> tuple[int, ...]:
    """Prompt lengths, comma-separated (``1k,4k,16k,32k``) or a list, shortest first; a length given twice is an
    error."""
    items = value.split(",") if isinstance(value, str) else list(value)
    lengths = tuple(parse_tokens(x, f"{what}: length") for x in items if str(x).strip())
    if not lengths:
        raise XoverError(f"{what}: give at least one length, e.g. 1k,4k,16k,32k")
    if len(set(lengths)) != len(lengths):
        raise XoverError(f"{what} {value!r} repeats a length: give each length once")
    return tuple(sorted(lengths))


def token_pool(token_types: Sequence[int]) -> tuple[int, ...]:
    """Ids of the ordinary tokens of a vocabulary (GGUF token types): no control, unused or user-defined ones."""
    return tuple(i for i, t in enumerate(token_types) if t == NORMAL_TOKEN)


@dataclasses.dataclass(frozen=True)
class Prompt:
    prompt: tuple[int, ...] | str  # token ids, or text
    length: int  # L as defined above
    prompt_id: str  # seed, index and a hash of the content: equal ids mean equal prompts


def content_hash(content: tuple[int, ...] | str) -> str:
    raw = content.encode() if isinstance(content, str) else ",".join(map(str, content)).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


class TokenPrompts:
    """Token-id prompts drawn from ``pool`` (ordinary token ids of the model) under ``seed``."""

    def __init__(self, pool: Sequence[int], seed: int) -> None:
        ids = sorted(set(pool))
        if len(ids) < 2:
            raise XoverError("the model's vocabulary has fewer than 2 ordinary tokens to build prompts from")
        self.seed = seed
        self.pool = tuple(ids)
        self._lead = tuple(random.Random(f"lead:{seed}").sample(ids, len(ids)))

    def make(self, index: int, length: int) -> Prompt:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        n = len(self._lead)
        lead = [self._lead[index % n], self._lead[(index // n) % n]][:length]
        rest = random.Random(f"body:{self.seed}:{index}").choices(self.pool, k=length - len(lead))
        ids = tuple(lead + rest)
        return Prompt(prompt=ids, length=length, prompt_id=f"ids:s{self.seed}:i{index}:{content_hash(ids)}")


# Plain words: every tokenizer splits them into ordinary tokens, and their order is drawn at random,
# so no two prompts share more than a few tokens by chance.
WORDS = tuple(
    """time year people way day man thing woman life child world school state family student group
    country problem hand part place case week company system program question work government number
    night point home water room mother area money story fact month lot right study book eye job word
    business issue side kind head house service friend father power hour game line end member law car
    city community name president team minute idea kid body information back parent face others level
    office door health person art war history party result change morning reason research girl guy
    moment air teacher force education river stone light green bright quick slow open close early late
    small large young old strong simple clear common local final whole full free real sure ready""".split()
)


class TextPrompts:
    """Text prompts of plain words; each starts with a word chosen by ``index`` (see module docstring)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._lead = tuple(random.Random(f"lead:{seed}").sample(WORDS, len(WORDS)))

    def draft(self, index: int, n_words: int) -> str:
        """About ``n_words`` words; the first two encode ``index``."""
        n = len(self._lead)
        rng = random.Random(f"body:{self.seed}:{index}")
        words = [self._lead[index % n].capitalize(), self._lead[(index // n) % n]]
        words += rng.choices(WORDS, k=max(0, n_words - 2))
        return " ".join(words) + "."

    async def make(self, index: int, length: int, count: Callable[[str], Awaitable[int]]) -> Prompt:
        """A text that ``count`` (the server's token count, BOS included) says is exactly ``length`` tokens."""
        text = await fit_text(lambda n_words: self.draft(index, n_words), length, count)
        return Prompt(prompt=text, length=length, prompt_id=f"text:s{self.seed}:i{index}:{content_hash(text)}")


# Appended one at a time when no cut of the draft counts exactly: characters that rarely merge with
# what precedes them, so one of them adds exactly one token on any vocabulary that holds them.
FILLERS = (".", ",", "x", ";", "-", "q", "!", "z", "0", " ")


async def fit_text(draft: Callable[[int], str], length: int, count: Callable[[str], Awaitable[int]]) -> str:
    """A prefix of a draft, completed if need be, that counts as exactly ``length`` tokens.

    Grows the draft until it is long enough, then binary-searches the cut (in characters) for the
    largest prefix of at most ``length`` tokens. Nearby cuts on both sides that count exactly are
    taken, one without trailing whitespace first. When none does (a token boundary cannot fall at
    ``length``: a cut just after a space on a byte vocabulary, a merge that swallows the next
    character), the longest prefix short of ``length`` is completed one token at a time with a
    filler character that adds exactly one token. Raises only when no filler can (a vocabulary that
    cannot express ``length`` tokens as text, e.g. one whose every character is two tokens).
    """
    n_words = max(8, length)
    text = draft(n_words)
    for _ in range(12):
        if await count(text) >= length:
            break
        n_words *= 2
        text = draft(n_words)
    else:
        raise XoverError(f"could not draft a text of {length} tokens: use token-id prompts (drop --text)")
    counts: dict[int, int] = {}

    async def at(cut: int) -> int:
        if cut not in counts:
            counts[cut] = await count(text[:cut])
        return counts[cut]

    lo, hi = 0, len(text)  # find the largest cut with count <= length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await at(mid) <= length:
            lo = mid
        else:
            hi = mid - 1
    near = [c for c in (*range(lo, max(0, lo - 16), -1), *range(lo + 1, min(len(text), lo + 16) + 1)) if c > 0]
    exact = [c for c in near if await at(c) == length]
    for cut in exact:
        if not text[cut - 1].isspace():
            return text[:cut]
    if exact:
        return text[: exact[0]]
    short = [c for c in near if await at(c) < length]
    if short:
        return await _complete(text[: max(short)], counts[max(short)], length, count)
    raise XoverError(
        f"no prefix of the drafted text is exactly {length} tokens for this tokenizer: use token-id prompts (drop --text)"
    )


async def _complete(text: str, n: int, length: int, count: Callable[[str], Awaitable[int]]) -> str:
    """``text`` (``n`` tokens) extended with filler characters, each adding exactly one token, to ``length``."""
    while n < length:
        for ch in FILLERS:
            if text.endswith(" ") and ch == " ":
                continue
            grown = await count(text + ch)
            if grown == n + 1:
                text, n = text + ch, grown
                break
        else:
            raise XoverError(
                f"no prefix of the drafted text is exactly {length} tokens for this tokenizer, and no "
                f"single character adds exactly one token after {n}: use token-id prompts (drop --text)"
            )
    return text
