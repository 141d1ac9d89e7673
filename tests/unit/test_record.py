"""xover record's recording file and its reading of answers, without a server (tests/real/test_record_real.py drives
the real one)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from xover.domain.workload import loads
from xover.proxy.record import CHAT, Proxy, Recording, Seen, _seen

SEEN = Seen(CHAT, True, 200, 0, None, 10, 0, 2, 0.1, 50.0, 100.0, 60.0, None)
Upstream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _through_proxy(
    tmp_path: Path, upstream: Upstream, talk: Callable[[TestClient], Awaitable[Any]], recording: type = Recording
) -> Any:
    """``talk(client)``'s result, the client a recording proxy (into ``tmp_path/rec.jsonl``) in front of ``upstream``,
    an asyncio server on a free port that stands in for llama-server."""

    async def run() -> Any:
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with TestClient(TestServer(Proxy(url, recording(tmp_path / "rec.jsonl", url)).app())) as client:
                return await talk(client)
        finally:
            server.close()

    return asyncio.run(run())


async def _request_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The body of the request whose head (up to its blank line) is ``head``, by its content-length."""
    length = next(int(x.split(b":")[1]) for x in head.lower().split(b"\r\n") if x.startswith(b"content-length"))
    return await reader.readexactly(length)


def _answering(head: bytes, *parts: bytes) -> Upstream:
    """An upstream that answers ``GET /health`` and reads one request, then writes the answer's ``head`` and each of
    ``parts`` 50 ms apart (each its own read for the proxy), then closes the connection."""

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        if request.startswith(b"GET /health"):  # the proxy's spare connection
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        else:
            await _request_body(reader, request)
            writer.write(head)
            for part in parts:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.05)
        await writer.drain()
        writer.close()

    return upstream


def _noting_connections(came: list[tuple[int, str]], reply: bytes, close: bool) -> Upstream:
    """An upstream that notes which connection each request came on (``came``: connection number, path), answers
    ``GET /health`` and keeps its connection alive, and answers a chat request with ``reply``, closing its connection
    after it where ``close`` (as llama-server does after a stream)."""
    ids = itertools.count()

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = next(ids)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                line = head.split(b"\r\n")[0].decode()
                came.append((conn, line.split()[1]))
                if line.startswith("GET /health"):
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    await writer.drain()
                    continue
                await _request_body(reader, head)
                writer.write(reply)
                await writer.drain()
                if close:
                    break
        except asyncio.IncompleteReadError:  # the proxy closed a kept-alive connection
            pass
        writer.close()

    return upstream


def _streamed(received: list[bytes]) -> Callable[[TestClient], Awaitable[None]]:
    """A client's streamed chat request whose answer's reads go into ``received`` as they come."""

    async def talk(client: TestClient) -> None:
        body = {"messages": [{"role": "user", "content": "hello"}], "stream": True}
        r = await client.post("/v1/chat/completions", json=body)
        while chunk := await r.content.readany():
            received.append(chunk)

    return talk


def test_a_second_proxy_drops_a_cut_line_appends_and_the_file_stays_a_session(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    first = Recording(path, "http://127.0.0.1:8080")
    first.turn([{"role": "user", "content": 'say "turn": 3'}], "ok", SEEN)
    first.event(SEEN)
    first.close()
    with path.open("a") as f:
        f.write('{"turn": 1, "messages": [{"role"')  # the line a SIGKILL cut
    second = Recording(path, "http://127.0.0.1:8080")
    second.turn([{"role": "user", "content": "again"}], "ok", SEEN)
    second.close()
    assert os.stat(path).st_mode & 0o777 == 0o600
    session = loads(path.read_text(), "rec.jsonl")
    assert [t.index for t in session.turns] == [0, 1] and session.turns[0].messages[0]["content"] == 'say "turn": 3'
    assert sum(1 for line in path.read_text().splitlines() if json.loads(line).get("format")) == 1


def test_a_stream_s_timings_and_the_client_s_clocks() -> None:
    t0 = 1_000_000
    events = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"c"}}]}\n\n',
        b'data: {"choices":[{"index":0,"finish_reason":"length","delta":{}}],"usage":{"prompt_tokens":100,'
        b'"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":60}},"timings":{"cache_n":60,"prompt_n":40,'
        b'"prompt_ms":20,"prompt_per_second":2000,"predicted_n":3,"predicted_ms":30,"predicted_per_second":100}}\n\n',
        b"data: [DONE]\n\n",
    ]
    ms = 1_000_000
    chunks = [(t0 + 50 * ms, events[0]), (t0 + 50 * ms, events[1]), (t0 + 60 * ms, events[2]),
              (t0 + 70 * ms, events[3]), (t0 + 71 * ms, events[4] + events[5])]  # fmt: skip
    seen, reply = _seen(CHAT, True, 200, (123, t0), 2.5, chunks, None)
    assert reply == "abc"
    assert (seen.prompt_tokens, seen.cached_tokens, seen.answer_tokens) == (100, 60, 3)
    assert seen.ttft_s == 0.05 and round(seen.decode_tps or 0, 6) == 100.0  # 2 tokens after the first in 20 ms
    assert (seen.server_prompt_tps, seen.server_decode_tps, seen.since_previous_s) == (2000.0, 100.0, 2.5)
    assert seen.error is None and seen.arrived_unix_ns == 123
    cut, _ = _seen(CHAT, True, 200, (123, t0), None, chunks[:3], "upstream broke after 10 bytes: ReadError")
    assert cut.error is not None and "upstream broke" in cut.error


def test_a_request_on_a_connection_the_server_dropped_is_sent_again(tmp_path: Path) -> None:
    """llama-server closes a kept-alive connection after a streamed response without saying so; the proxy's next
    request on it fails before the server has seen it (RemoteProtocolError: the benchmark met it as a 502 about once
    in 60 requests). Injected here: an upstream that reads the first request and hangs up without a word, then
    answers. The client gets the answer, the recording its turn, and the upstream saw the request twice."""
    seen: list[bytes] = []
    answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()  # fmt: skip

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /health"):  # the proxy's spare connection
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()
            return
        seen.append(await _request_body(reader, head))
        if len(seen) > 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(answer), answer))  # fmt: skip
            await writer.drain()
        writer.close()

    async def talk(client: TestClient) -> tuple[int, dict]:
        r = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]})
        return r.status, await r.json()

    status, got = _through_proxy(tmp_path, upstream, talk)
    assert status == 200 and got["choices"][0]["message"]["content"] == "hi"
    assert len(seen) == 2 and seen[0] == seen[1]  # the same bytes, sent again on a new connection
    lines = (tmp_path / "rec.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["assistant"] == "hi"


def test_a_stream_passes_byte_for_byte_and_its_done_only_after_the_turn_is_on_disk(tmp_path: Path) -> None:
    """The events before ``data: [DONE]`` go on at once, even when [DONE] shares their chunk; [DONE] (where the
    OpenAI client stops reading) goes only after the turn's line is written, so a proxy killed the moment the client
    has its answer has recorded it. Injected: an upstream whose last chunk holds the last token, the timings and
    [DONE]."""
    first = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    last = (b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
            b'data: {"choices":[{"index":0,"finish_reason":"length","delta":{}}],"usage":{"prompt_tokens":3,'
            b'"completion_tokens":2}}\n\ndata: [DONE]\n\n')  # fmt: skip
    received: list[bytes] = []
    at_turn: list[bytes] = []

    class Watched(Recording):
        def turn(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            at_turn.append(b"".join(received))
            super().turn(*args, **kwargs)

    upstream = _answering(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n", first, last
    )
    _through_proxy(tmp_path, upstream, _streamed(received), Watched)
    assert b"".join(received) == first + last  # every byte, in order
    assert len(at_turn) == 1 and b"[DONE]" not in at_turn[0]
    assert loads((tmp_path / "rec.jsonl").read_text(), "rec.jsonl").turns[0].assistant == "ab"


@pytest.mark.parametrize(
    ("end", "split"),
    [(b"\n\n", None), (b"", None), (b"\n\n", -6)],
    ids=["whole-event", "before-its-blank-line", "done-split-across-reads"],
)
def test_a_connection_that_breaks_after_the_stream_s_end_loses_nothing(
    tmp_path: Path, end: bytes, split: int | None
) -> None:
    """An upstream that sends the whole stream, ``data: [DONE]`` included, then drops the connection without ending
    its chunked body: the answer was whole. The client gets every byte and no error event, and the recording keeps
    the turn (an answer broken before [DONE] is an event with its error, above); a break before [DONE]'s blank line
    gets it added, so that the client's SSE parser sees the event; a ``data: [DONE]`` that arrives in two reads
    (``data: [DO``, then ``NE]``) is still found. Injected: such an upstream."""
    stream = (b'data: {"choices":[{"index":0,"delta":{"content":"ab"}}]}\n\n'
              b'data: {"choices":[{"index":0,"finish_reason":"stop","delta":{}}]}\n\ndata: [DONE]')  # fmt: skip
    received: list[bytes] = []

    sent = stream + end
    upstream = _answering(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
        # the split: two reads, apart; no last chunk ("0"): the body never ends
        *(b"%x\r\n%s\r\n" % (len(part), part) for part in ((sent[:split], sent[split:]) if split else (sent,))),
    )
    _through_proxy(tmp_path, upstream, _streamed(received))
    assert b"".join(received) == stream + b"\n\n"
    session = loads((tmp_path / "rec.jsonl").read_text(), "rec.jsonl")
    assert [t.assistant for t in session.turns] == ["ab"]


def test_the_next_request_goes_over_the_spare_connection_the_proxy_opened(tmp_path: Path) -> None:
    """llama-server closes a connection after a streamed answer; the proxy opens a spare one at once (``GET /health``,
    kept alive), so the next request does not pay a connect. Injected: an upstream that keeps a connection alive
    after /health and closes it after a chat answer, as llama-server does; it notes which connection each request
    came on."""
    came: list[tuple[int, str]] = []
    answer = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'
    upstream = _noting_connections(
        came, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n" + answer, close=True
    )

    async def talk(client: TestClient) -> None:
        for _ in range(2):
            await asyncio.sleep(0.2)  # the spare connection's /health has gone and come back
            r = await client.post("/v1/chat/completions", json={"messages": [], "stream": True})
            await r.read()
        await asyncio.sleep(0.2)

    _through_proxy(tmp_path, upstream, talk)
    chats = [(conn, i) for i, (conn, path) in enumerate(came) if path == "/v1/chat/completions"]
    # each chat request came on a connection that a /health opened just before it, never on a new one
    assert len(chats) == 2 and all(i > 0 and came[i - 1] == (conn, "/health") for conn, i in chats)


def test_a_kept_alive_connection_after_a_whole_answer_is_used_again_without_a_spare(tmp_path: Path) -> None:
    """A non-streamed answer leaves llama-server's connection open (only a stream's end closes it): the proxy sends
    its next request over it, and opens no spare connection with a ``GET /health``. Injected: an upstream that keeps
    every connection alive and notes which connection each request came on."""
    came: list[tuple[int, str]] = []
    answer = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}}]}).encode()
    upstream = _noting_connections(
        came,
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer) + answer,
        close=False,
    )

    async def talk(client: TestClient) -> None:
        for _ in range(2):
            await asyncio.sleep(0.2)  # the start's spare connection is in the pool; a later one would be too
            r = await client.post("/v1/chat/completions", json={"messages": [], "stream": False})
            assert (await r.json())["choices"][0]["message"]["content"] == "a"
        await asyncio.sleep(0.2)

    _through_proxy(tmp_path, upstream, talk)
    # the spare connection the proxy opens as it starts, then both requests on it and nothing else
    assert came == [(0, "/health"), (0, "/v1/chat/completions"), (0, "/v1/chat/completions")]


def test_done_is_found_only_where_a_line_starts() -> None:
    from xover.proxy.record import _done_at

    quoted = b'data: {"choices":[{"delta":{"content":"ends with data: [DONE]"}}]}\n\n'
    assert _done_at(quoted, True) == -1  # an answer about SSE is not the end of the stream
    assert _done_at(quoted + b"data: [DONE]\n\n", True) == len(quoted)
    assert _done_at(b"data: [DONE]\n\n", True) == 0
    assert _done_at(b"data: [DONE]\n\n", False) == -1  # the chunk goes on a line the previous one began
    assert _done_at(b"\r\ndata: [DONE]\r\n\r\n", False) == 2


def test_a_line_that_may_begin_done_is_found_at_a_read_s_end() -> None:
    from xover.proxy.record import _done_begins

    event = b'data: {"choices":[]}\n\n'
    assert _done_begins(event + b"data: [DO", True) == len(event)
    assert _done_begins(event + b"d", True) == len(event)
    assert _done_begins(b"data: [DON", True) == 0 and _done_begins(b"data: [DON", False) == -1  # mid-line
    assert _done_begins(event, True) == -1  # ends a line: nothing to wait for
    assert _done_begins(event + b"data: [DONE]", True) == -1  # whole: _done_at's
    assert _done_begins(b'data: {"content":"data: [DO', True) == -1  # inside an event, not a line's start
