"""The session generator and the session file format: determinism, shape, rewrites, validation."""

from __future__ import annotations

import hashlib
import json

import pytest

from xover.domain.workload import (
    FORMAT,
    Session,
    Turn,
    WorkloadSpec,
    check_feedable,
    dumps,
    estimate_tokens,
    generate,
    loads,
    messages_for_turn,
    session_id,
)
from xover.errors import XoverError

SMALL = WorkloadSpec(seed=7, turns=12, system_tokens=2048, target_tokens=8192, rewrite_every=4)


def _text(spec: WorkloadSpec) -> str:
    return dumps(generate(spec))


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    a, b = _text(SMALL), _text(SMALL)
    assert a.encode() == b.encode()
    assert _text(WorkloadSpec(**{**SMALL.__dict__, "seed": 8})) != a


def test_file_round_trips_and_has_a_header_and_one_line_per_turn() -> None:
    text = _text(SMALL)
    lines = text.splitlines()
    assert len(lines) == 1 + SMALL.turns
    header = json.loads(lines[0])
    assert header["format"] == FORMAT and header["generator"]["seed"] == 7
    s = loads(text)
    assert [t.index for t in s.turns] == list(range(SMALL.turns))
    assert dumps(s) == text
    assert session_id(text) == hashlib.sha256(text.encode()).hexdigest()[:16]


def test_sizes_follow_the_spec() -> None:
    s = generate(SMALL)
    system = s.turns[0].messages[0]
    assert system["role"] == "system" and "read_file" in system["content"]
    assert abs(estimate_tokens([system], 4.0) - SMALL.system_tokens) < 0.1 * SMALL.system_tokens
    last = estimate_tokens(s.turns[-1].messages, 4.0)
    assert SMALL.target_tokens * 0.85 < last < SMALL.target_tokens * 1.35
    sizes = [estimate_tokens(t.messages, 4.0) for t in s.turns]
    assert sizes[-1] > sizes[0] * 3


def test_chars_per_token_scales_the_text() -> None:
    bytes_spec = WorkloadSpec(seed=7, turns=4, system_tokens=1024, target_tokens=4096, chars_per_token=1.0)
    s = generate(bytes_spec)
    assert abs(estimate_tokens([s.turns[0].messages[0]], 1.0) - 1024) < 200


def test_turns_append_a_reply_and_a_user_message_except_where_they_rewrite() -> None:
    s = generate(SMALL)
    for t in s.turns[1:]:
        prev = s.turns[t.index - 1]
        assert len(t.messages) == len(prev.messages) + 2
        assert t.messages[-2] == {"role": "assistant", "content": prev.assistant}
        assert t.messages[-1]["role"] == "user"
        rewritten = s.rewrites(t.index)
        assert bool(rewritten) == (t.index % SMALL.rewrite_every == 0), t.index
        for j in range(len(prev.messages)):
            assert (t.messages[j] == prev.messages[j]) == (j not in rewritten)


def test_rewrites_alternate_a_deleted_block_and_a_modified_line() -> None:
    s = generate(SMALL)
    kinds = []
    for i in (4, 8):
        (j,) = s.rewrites(i)
        old, new = s.turns[i - 1].messages[j]["content"], s.turns[i].messages[j]["content"]
        assert old.startswith("[read_file for '") and new.split("\n", 1)[0] == old.split("\n", 1)[0]
        pre = next(k for k, (a, b) in enumerate(zip(old, new)) if a != b)
        post = next(k for k, (a, b) in enumerate(zip(reversed(old), reversed(new))) if a != b)
        kinds.append("delete" if pre + post >= len(new) else "modify")  # new = old minus one contiguous run
        assert "Here is the diff:" in s.turns[i].messages[-1]["content"]
    assert kinds == ["delete", "modify"]


def test_no_rewrites_when_disabled() -> None:
    s = generate(WorkloadSpec(seed=1, turns=8, system_tokens=1024, target_tokens=4096, rewrite_every=0))
    assert all(s.rewrites(i) == () for i in range(8))


def test_generated_replies_replace_the_recorded_ones() -> None:
    s = generate(SMALL)
    check_feedable(s)
    msgs = messages_for_turn(s, 3, ["r0", "r1", "r2"])
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == ["r0", "r1", "r2"]
    assert messages_for_turn(s, 3, None) == [dict(m) for m in s.turns[3].messages]
    assert s.turns[3].messages[3]["content"] != "r0"  # the session itself is untouched


def test_a_few_shot_prefix_is_not_taken_for_replies() -> None:
    shot = ({"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"})
    s = Session(
        turns=(
            Turn(0, (*shot, {"role": "user", "content": "u0"}), "x0"),
            Turn(
                1,
                (
                    *shot,
                    {"role": "user", "content": "u0"},
                    {"role": "assistant", "content": "x0"},
                    {"role": "user", "content": "u1"},
                ),
                "x1",
            ),
        )
    )
    check_feedable(s)
    assert [m["content"] for m in messages_for_turn(s, 1, ["gen"]) if m["role"] == "assistant"] == ["a", "gen"]


def test_a_session_that_drops_replies_needs_exact() -> None:
    s = Session(
        turns=(Turn(0, ({"role": "user", "content": "a"},), "x"), Turn(1, ({"role": "user", "content": "b"},), "y"))
    )
    with pytest.raises(XoverError, match="--exact"):
        check_feedable(s)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "holds no turns"),
        ("not json\n", "line 1 is not JSON"),
        ("[1]\n", "not a JSON object"),
        ('{"turn": 1, "messages": [{"role": "user", "content": "x"}]}\n', "expected 0"),
        ('{"turn": 0, "messages": []}\n', "non-empty list"),
        ('{"turn": 0, "messages": [{"content": "x"}]}\n', 'has no "role"'),
        ('{"turn": 0, "messages": [{"role": "assistant", "content": "x"}]}\n', "last message is the assistant"),
        ('{"turn": 0, "messages": [{"role": "user", "content": "x"}], "assistant": 3}\n', "must be a string"),
        ('{"format": "other/9"}\n', "regenerate"),
        (
            '{"turn": 0, "messages": [{"role": "user", "content": "x"}]}\n{"format": "xover-session/1"}\n',
            "only come first",
        ),
    ],
)
def test_bad_files_are_one_line_errors(text: str, match: str) -> None:
    with pytest.raises(XoverError, match=match) as e:
        loads(text, source="f.jsonl")
    assert "\n" not in str(e.value)


def test_a_recorded_session_without_header_or_replies_loads() -> None:
    s = loads('{"turn": 0, "messages": [{"role": "user", "content": "hi"}]}\n')
    assert s.header is None and s.turns[0].assistant == ""


@pytest.mark.parametrize(
    "kw", [{"turns": 1}, {"system_tokens": 10}, {"target_tokens": 1000}, {"rewrite_every": 1}, {"chars_per_token": 0}]
)
def test_spec_validation(kw: dict[str, object]) -> None:
    with pytest.raises(XoverError):
        WorkloadSpec(**kw)  # type: ignore[arg-type]
