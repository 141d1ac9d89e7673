"""Shape-only recordings: a session's structure without its text. Pure.

A recorded coding session holds the user's source code and secrets. ``xover record --shape-only`` keeps none of its
text. Per message it keeps the role and, per block of text, the block's length in the server's tokens and a keyed
hash of the text:

- a block is a string ``content``, each text part of a list ``content``, or a message's ``tool_calls`` (written as
  JSON: the chat template renders them as text);
- the hash is HMAC-SHA256 under a key that stays on the recording machine (``xover record``'s key file), cut to
  :data:`HASH_HEX` hex digits. Equal blocks hash alike, so what the cache needs is kept: the conversation resent
  as a shared prefix, an earlier block rewritten in place. A guess at a short block (``"yes"``) cannot be checked
  against the file without the key.

A shape-only turn is a line of an ``xover-session/1`` file with ``"shape"`` where a full one has ``"messages"``::

    {"turn": 3, "shape": [{"role": "system", "blocks": [[1830, "9f2c..."]]}, ...],
     "assistant": [212, "41be..."], "recorded": {...the proxy's timings...}}

(``"parts": true`` on a message whose content was a list of parts; ``"tool_calls": true`` where its last block was
its tool calls). :func:`realize` turns it back into a :class:`~xover.domain.workload.Session` of synthetic text:
every block becomes text of its recorded token length, the same text wherever the hash is the same, different text
(within its first few tokens: it opens with the hash) wherever it differs, so the server's prompt cache meets the same hits and misses. Making text
of an exact token length needs the replaying model's tokenizer: the caller supplies it (:func:`filler` drafts, the
server trims).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from xover.domain.workload import FORMAT, Message, Session, Turn, header_and_turns, json_lines, loads
from xover.errors import XoverError

HASH_HEX = 16  # 64 bits: collisions between a session's blocks are out of reach


@dataclasses.dataclass(frozen=True)
class Block:
    tokens: int  # in the recording server's tokens
    hash: str  # HMAC-SHA256 of the text under the recorder's key, HASH_HEX hex digits


@dataclasses.dataclass(frozen=True)
class ShapeMessage:
    role: str
    blocks: tuple[Block, ...]
    parts: bool = False  # the content was a list of text parts
    tool_calls: bool = False  # the last block is the message's tool calls


@dataclasses.dataclass(frozen=True)
class ShapeTurn:
    index: int
    messages: tuple[ShapeMessage, ...]
    assistant: Block | None  # the recorded reply's block; None when the file has none
    recorded: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class ShapeSession:
    turns: tuple[ShapeTurn, ...]
    header: Mapping[str, Any] | None = None

    def blocks(self) -> set[Block]:
        """Every distinct block of the session: what :func:`realize` needs text for."""
        out = {b for t in self.turns for m in t.messages for b in m.blocks}
        return out | {t.assistant for t in self.turns if t.assistant is not None}


def block_hash(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()[:HASH_HEX]


def message_blocks(message: Message) -> tuple[list[str], bool, bool]:
    """A message's blocks of text, whether its content was a list of parts, and whether it had tool calls."""
    content = message.get("content")
    parts = isinstance(content, list)
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = [str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
    else:
        texts = []
    calls = message.get("tool_calls")
    if calls:
        texts.append(json.dumps(calls, sort_keys=True, ensure_ascii=False))
    return texts, parts, bool(calls)


def shape_of(messages: Sequence[Message], blocks: Mapping[str, tuple[int, str]]) -> list[dict[str, Any]]:
    """The ``"shape"`` of a turn's messages; ``blocks`` holds every block's token length and hash
    (:func:`block_hash`), each computed once."""
    out = []
    for m in messages:
        texts, parts, calls = message_blocks(m)
        entry: dict[str, Any] = {"role": str(m.get("role")), "blocks": [list(blocks[t]) for t in texts]}
        if parts:
            entry["parts"] = True
        if calls:
            entry["tool_calls"] = True
        out.append(entry)
    return out


def blocks_to_count(messages: Sequence[Message], reply: str) -> set[str]:
    """The texts whose token lengths a shape-only turn needs."""
    return {t for m in messages for t in message_blocks(m)[0]} | {reply}


def is_shape_only(text: str) -> bool:
    """Whether a session file's turns are shapes (it has at least one ``"shape"`` turn line)."""
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return False
        if isinstance(obj, dict) and "turn" in obj:
            return "shape" in obj
    return False


def loads_shapes(text: str, source: str = "workload") -> ShapeSession:
    """Parse a shape-only session; every problem is one line naming the line to fix."""
    header, turns = header_and_turns(text, source, _shape_turn, '"shape": [...]')
    return ShapeSession(turns=turns, header=header)


def _block(value: Any, where: str) -> Block:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not isinstance(value[0], int)
        or isinstance(value[0], bool)
        or value[0] < 0
        or not isinstance(value[1], str)
    ):
        raise XoverError(f'{where}: a block must be [tokens, hash], e.g. [120, "9f2c0a1b3d4e5f60"]; got {value!r}')
    return Block(value[0], value[1])


def _shape_turn(obj: dict[str, Any], expected: int, where: str) -> ShapeTurn:
    if obj.get("turn") != expected:
        raise XoverError(f'{where}: "turn" is {obj.get("turn")!r}, expected {expected}: number turns 0, 1, 2, ...')
    shape = obj.get("shape")
    if not isinstance(shape, list) or not shape:
        raise XoverError(f'{where}: "shape" must be a non-empty list of messages (a full turn has "messages")')
    messages = []
    for k, m in enumerate(shape):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("blocks"), list):
            raise XoverError(f'{where}: message {k} must be {{"role": ..., "blocks": [[tokens, hash], ...]}}')
        blocks = tuple(_block(b, f"{where}, message {k}") for b in m["blocks"])
        messages.append(ShapeMessage(m["role"], blocks, bool(m.get("parts")), bool(m.get("tool_calls"))))
    if messages[-1].role == "assistant":
        raise XoverError(f"{where}: the last message is the assistant's; a turn must end with what the client sends")
    reply = obj.get("assistant")
    assistant = _block(reply, f"{where}, assistant") if reply is not None else None
    recorded = obj.get("recorded") if isinstance(obj.get("recorded"), dict) else None
    return ShapeTurn(expected, tuple(messages), assistant, recorded)


# ---- synthetic text ------------------------------------------------------------------------------

_WORDS = (
    "alpha", "buffer", "cache", "delta", "engine", "field", "graph", "handle", "index", "join", "kernel", "layer",
    "matrix", "node", "offset", "parse", "query", "range", "slice", "token", "update", "value", "window", "yield",
    "batch", "commit", "decode", "expert", "filter", "group", "header", "input", "label", "merge", "output", "prompt",
    "record", "stream", "thread", "vector",
)  # fmt: skip


def filler(hash_: str, n_chars: int) -> str:
    """Deterministic text of ``n_chars`` characters for a block: it opens with the block's hash, so blocks of
    different hashes differ within their first few characters, and goes on with words drawn from a generator seeded by it."""
    rng = random.Random(hash_)
    out, size = [hash_ + " "], len(hash_) + 1
    while size < n_chars:
        word = rng.choice(_WORDS) if rng.random() > 0.08 else str(rng.randrange(1000))
        out.append(word + ("\n" if rng.random() < 0.1 else " "))
        size += len(out[-1])
    return "".join(out)[:n_chars]


def from_log(shapes: ShapeSession) -> bool:
    """Whether the session was imported from a server's log (``xover record --from-log``): its one message a turn
    counts the whole prompt, the chat template's tokens included."""
    recorder = shapes.header.get("recorder") if shapes.header else None
    return isinstance(recorder, Mapping) and bool(recorder.get("from_log"))


def without_template(shapes: ShapeSession, tokens: int) -> ShapeSession:
    """``shapes`` with each turn's first block ``tokens`` shorter (never below 0): a log's prompt counts already hold
    the chat template's tokens, which the replay's template adds again. A block keeps its hash, so the turns' shared
    prefixes stay shared."""

    def trimmed(m: ShapeMessage) -> ShapeMessage:
        if not m.blocks:
            return m
        first = m.blocks[0]
        return dataclasses.replace(m, blocks=(Block(max(first.tokens - tokens, 0), first.hash), *m.blocks[1:]))

    turns = tuple(dataclasses.replace(t, messages=(trimmed(t.messages[0]), *t.messages[1:])) for t in shapes.turns)
    return dataclasses.replace(shapes, turns=turns)


def realize(shapes: ShapeSession, text_of: Callable[[Block], str]) -> Session:
    """The session as synthetic text: each block replaced by ``text_of(block)`` (text of the block's token length,
    the same for the same block), each message rebuilt with its role and its content as a string or as text parts
    (tool calls become text: their JSON's tokens are kept, not their structure)."""
    turns = []
    for t in shapes.turns:
        msgs: list[dict[str, Any]] = []
        for m in t.messages:
            texts = [text_of(b) for b in m.blocks]
            content: Any = [{"type": "text", "text": x} for x in texts] if m.parts else "".join(texts)
            msgs.append({"role": m.role, "content": content})
        reply = text_of(t.assistant) if t.assistant is not None else ""
        turns.append(Turn(index=t.index, messages=tuple(msgs), assistant=reply))
    header = {"format": FORMAT, "realized": {"from": "shape-only", "blocks": len(shapes.blocks())}}
    return Session(turns=tuple(turns), header=header)


def turn_count(text: str, source: str = "workload") -> int:
    """The turns of a session file, full or shape-only."""
    if is_shape_only(text):
        return len(loads_shapes(text, source).turns)
    return len(loads(text, source).turns)


def recorded_of(text: str) -> tuple[str, list[Mapping[str, Any] | None]]:
    """A session file's kind ("full", "shape-only", or "log" for ``xover record --from-log``) and each turn's
    ``recorded`` object (None where a turn has none: a generated session has none at all)."""
    kind, out = "full", []
    for _, obj in json_lines(text, "workload"):
        if "format" in obj and isinstance(obj.get("recorder"), dict) and obj["recorder"].get("from_log"):
            kind = "log"
        elif "turn" in obj:
            kind = "shape-only" if "shape" in obj and kind == "full" else kind
            out.append(obj["recorded"] if isinstance(obj.get("recorded"), dict) else None)
    return kind, out
