"""`xover record --from-log` (issue 48 item 3): llama-server's own log, read back as requests and as a shape-only
session. The fixtures are real logs: the pinned llama.cpp's and ik_llama.cpp 0.1.5's CPU servers on tiny-moe, four
turns of a generated agentic session (the conversation resent each turn, the slot's cache reused) and, in
llama.cpp's, one /completion request on another slot. The same traffic reads the same from both engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from xover.domain.server_log import parse_log, session_lines
from xover.domain.turn_shape import Block, filler, loads_shapes, realize
from xover.domain.workload import dumps
from xover.errors import XoverError

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"
ROOT = Path(__file__).parent.parent.parent
PROMPTS = [1059, 2492, 3446, 5033]  # the generated session's turns, as both servers counted them
CACHED = [0, 1059, 2492, 3446]  # each turn's prefix from the slot's cache: the turn before's whole prompt


@pytest.mark.parametrize("name", ["llama.cpp-0c1e570.log", "ik_llama.cpp-0.1.5.log"])
def test_both_engines_logs_read_as_the_same_requests(name: str) -> None:
    engine, requests = parse_log((LOGS / name).read_text(), name)
    assert engine == name.split("-")[0]
    chat = requests[:4]
    assert [r.prompt_tokens for r in chat] == PROMPTS and [r.cached_tokens for r in chat] == CACHED
    assert all(r.answer_tokens == 8 and r.prompt_ms > 0 and r.decode_ms > 0 for r in chat)
    if engine == "llama.cpp":  # the /completion request, on a slot of its own
        assert [(r.prompt_tokens, r.cached_tokens, r.answer_tokens, r.slot) for r in requests[4:]] == [(10, 0, 4, 2)]
        assert [r.started_s for r in requests] == sorted(r.started_s for r in requests)  # type: ignore[type-var]


def test_a_verbose_log_names_the_whole_prompt() -> None:
    """xover's own servers log at -lv 4 (``new prompt, ... task.n_tokens``): the H200 study's cached turns read as
    16,384 tokens from the cache and 512 or 2,048 new ones, as the study measured them."""
    log = ROOT / "studies" / "h200-backends" / "qwen3-30b-a3b" / "logs" / "server-cuda-gpu-1.log"
    _, requests = parse_log(log.read_text(), log.name)
    cold = [r.prompt_tokens for r in requests if r.cached_tokens == 0 and r.answer_tokens == 32]
    cached = [(r.cached_tokens, r.prompt_tokens - r.cached_tokens) for r in requests if r.cached_tokens]
    assert cold == [1024, 4096, 16384, 32768] and set(cached) == {(16384, 512), (16384, 2048)}


def test_the_session_repeats_each_slots_cached_prefix() -> None:
    name = "llama.cpp-0c1e570.log"
    engine, requests = parse_log((LOGS / name).read_text(), name)
    lines = session_lines(engine, requests, name)
    assert lines[0]["recorder"]["shape_only"] and lines[0]["recorder"]["replay"] == "exact"
    text = "\n".join(__import__("json").dumps(x) for x in lines)
    shapes = loads_shapes(text, name)
    real = realize(shapes, lambda b: filler(b.hash, b.tokens))  # one token a character
    content = [str(t.messages[0]["content"]) for t in real.turns]
    assert [len(c) for c in content] == [r.prompt_tokens for r in requests]
    for i in range(1, 4):  # each turn opens with the cached part of the one before, then differs
        before = content[i - 1] + real.turns[i - 1].assistant
        cut = CACHED[i]
        assert content[i][:cut] == before[:cut] and content[i][cut : cut + 16] != before[cut : cut + 16]
    assert not content[4].startswith(content[3][:1])  # another slot: nothing shared
    assert all(t.recorded and t.recorded["path"] == "log" for t in shapes.turns)
    assert dumps(real).count('"turn"') == 5


def test_a_block_cut_by_the_cache_keeps_its_hash() -> None:
    from xover.domain.server_log import _prefix

    ctx = [Block(10, "a" * 16), Block(5, "b" * 16)]
    assert _prefix(ctx, 12) == [Block(10, "a" * 16), Block(2, "b" * 16)] and _prefix(ctx, 0) == []
    assert _prefix(ctx, 99) == ctx


def test_an_unknown_log_is_refused_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(XoverError) as e:
        parse_log('{"level": "info", "msg": "listening"}\nanother line\n', "server.json")
    msg = str(e.value)
    assert "server.json line 1" in msg and "listening" in msg and "\n" not in msg
    broken = "0.00.1.2 I slot print_timing: id 0 | task 3 | prompt eval time = fast / many tokens\n"
    with pytest.raises(XoverError, match="line 1 .*a timing line neither format reads"):
        parse_log(broken, "odd.log")
