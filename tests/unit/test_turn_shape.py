"""Shape-only sessions (issue 48 item 2): what a shape keeps, and that realizing it keeps the prefix structure."""

from __future__ import annotations

import json

import pytest

from xover.domain.turn_shape import (
    Block,
    block_hash,
    filler,
    is_shape_only,
    loads_shapes,
    message_blocks,
    realize,
    shape_of,
    turn_count,
)
from xover.domain.workload import WorkloadSpec, dumps, generate
from xover.errors import XoverError

KEY = b"k" * 32
SPEC = WorkloadSpec(seed=3, turns=8, system_tokens=256, target_tokens=6_000, rewrite_every=3, chars_per_token=1.0)


def _shape_file(messages_per_turn: list[list[dict[str, object]]], replies: list[str]) -> str:
    """A shape-only file as xover record writes it, with one token a character (a byte vocabulary)."""
    lines = [json.dumps({"format": "xover-session/1", "recorder": {"shape_only": True}})]
    for i, (msgs, reply) in enumerate(zip(messages_per_turn, replies, strict=True)):
        texts = {t for m in msgs for t in message_blocks(m)[0]} | {reply}
        blocks = {t: (len(t), block_hash(KEY, t)) for t in texts}
        lines.append(json.dumps({"turn": i, "shape": shape_of(msgs, blocks),
                                 "assistant": [len(reply), block_hash(KEY, reply)]}))  # fmt: skip
    return "\n".join(lines) + "\n"


def _by_chars(block: Block) -> str:
    return filler(block.hash, block.tokens)


def test_a_generated_session_realized_keeps_every_length_and_every_shared_block() -> None:
    session = generate(SPEC)
    text = _shape_file([list(t.messages) for t in session.turns], [t.assistant for t in session.turns])
    assert is_shape_only(text) and not is_shape_only(dumps(session)) and turn_count(text) == turn_count(dumps(session))
    real = realize(loads_shapes(text), _by_chars)
    for a, b in zip(session.turns, real.turns, strict=True):
        assert [m["role"] for m in a.messages] == [m["role"] for m in b.messages]
        assert [len(str(m["content"])) for m in a.messages] == [len(str(m["content"])) for m in b.messages]
        assert len(a.assistant) == len(b.assistant)
    # equal where the real text was equal, different where it was not: the same cache hits and misses
    for i in range(1, len(session.turns)):
        old, new = session.turns[i - 1].messages, session.turns[i].messages
        r_old, r_new = real.turns[i - 1].messages, real.turns[i].messages
        for j in range(min(len(old), len(new))):
            assert (old[j] == new[j]) == (r_old[j] == r_new[j]), (i, j)
    assert any(session.rewrites(i) for i in range(len(session.turns)))  # the spec rewrites context: tested above
    assert [real.rewrites(i) for i in range(len(real.turns))] == [
        session.rewrites(i) for i in range(len(session.turns))
    ]


def test_a_shape_holds_no_text_and_its_hashes_need_the_key() -> None:
    secret = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": secret}]
    text = _shape_file([msgs], ["ok"])
    assert secret not in text and "wJalr" not in text and "be brief" not in text
    assert block_hash(KEY, secret) in text and block_hash(b"x" * 32, secret) not in text


def test_content_parts_and_tool_calls_are_blocks() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {}},
                                      {"type": "text", "text": "here"}]},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "print(1)"},
    ]  # fmt: skip
    texts, parts, has_calls = message_blocks(msgs[0])
    assert texts == ["look", "here"] and parts and not has_calls
    texts, parts, has_calls = message_blocks(msgs[1])
    assert texts[0] == "" and json.loads(texts[1]) == calls and has_calls and not parts
    real = realize(loads_shapes(_shape_file([msgs], ["done"])), _by_chars)
    (turn,) = real.turns
    assert [p["type"] for p in turn.messages[0]["content"]] == ["text", "text"]  # parts stay parts
    assert len(turn.messages[1]["content"]) == len(texts[1])  # the calls' tokens, as text


def test_different_blocks_differ_at_once() -> None:
    a, b = filler("0123456789abcdef", 40), filler("fedcba9876543210", 40)
    assert a[0] != b[0] and len(a) == len(b) == 40 and filler("0123456789abcdef", 40) == a
    assert filler("0123456789abcdef", 8) == a[:8]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"turn": 1, "shape": [{"role": "user", "blocks": []}]}', "expected 0"),
        ('{"turn": 0, "shape": []}', "non-empty list"),
        ('{"turn": 0, "shape": [{"role": "user"}]}', "message 0 must be"),
        ('{"turn": 0, "shape": [{"role": "user", "blocks": [[-1, "ab"]]}]}', "[tokens, hash]"),
        ('{"turn": 0, "shape": [{"role": "user", "blocks": [["7", "ab"]]}]}', "[tokens, hash]"),
        ('{"turn": 0, "shape": [{"role": "assistant", "blocks": []}]}', "last message is the assistant"),
        ('{"format": "xover-session/9"}', "is not 'xover-session/1'"),
        ("[1, 2", "is not JSON"),
    ],
)
def test_a_bad_shape_line_is_one_line_naming_it(line: str, says: str) -> None:
    with pytest.raises(XoverError) as e:
        loads_shapes(line + "\n", "rec.jsonl")
    assert says in str(e.value) and "rec.jsonl line 1" in str(e.value) and "\n" not in str(e.value)


def test_events_are_skipped_and_a_file_without_turns_is_refused() -> None:
    with pytest.raises(XoverError, match="holds no turns"):
        loads_shapes('{"event": "request", "recorded": {}}\n', "rec.jsonl")


def test_a_logs_turns_lose_the_templates_tokens_and_keep_their_shared_prefix() -> None:
    from xover.domain.turn_shape import ShapeMessage, ShapeSession, ShapeTurn, from_log, without_template

    a, n1 = Block(1000, "a" * 16), Block(400, "n" * 16)
    turns = (ShapeTurn(0, (ShapeMessage("user", (a,)),), None),
             ShapeTurn(1, (ShapeMessage("user", (a, n1)),), None))  # fmt: skip
    shapes = ShapeSession(turns, {"format": "xover-session/1", "recorder": {"from_log": "s.log"}})
    assert from_log(shapes) and not from_log(ShapeSession(turns))
    trimmed = without_template(shapes, 50)
    assert [m.blocks for t in trimmed.turns for m in t.messages] == [(Block(950, a.hash),), (Block(950, a.hash), n1)]
    real = realize(trimmed, _by_chars)
    first, second = (str(t.messages[0]["content"]) for t in real.turns)
    assert second.startswith(first) and len(second) == 1350
    assert without_template(shapes, 5000).turns[0].messages[0].blocks == (Block(0, a.hash),)
