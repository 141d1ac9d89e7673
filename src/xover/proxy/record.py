"""``xover record``: an OpenAI-compatible pass-through in front of a llama-server that records each turn.

A coding agent (Cline, Roo, Continue, any OpenAI client) points at the proxy instead of the server and works as
before: every request is forwarded to the upstream server as it came, and every byte of the answer goes back as it
arrives (a stream's chunks are written to the client the moment they are read). Per request the proxy records
what the server's timings said and what the client saw:

- the prompt's tokens, the part the server took from its cache (``cache_n``), the answer's tokens;
- TTFT as the client saw it (from the request's arrival at the proxy to the first generated text passed on) and
  the decode rate it saw (answer tokens after the first over the time they took), beside the server's own rates;
- the time since the previous request (the agent's and the user's think time between turns).

Each chat request is also a turn of an ``xover-session/1`` recording (:mod:`xover.domain.workload`): its messages and
the recorded reply, so ``xover session --workload`` replays it. Completion requests (``/v1/completions``,
``/completion``) are recorded as events beside the turns (their timings, not a turn).

With ``shape_only`` a chat turn keeps no text: per message its role, per block of text its token length (the
upstream server's ``/tokenize``, asked once per distinct block) and a keyed hash (:mod:`xover.domain.turn_shape`);
the key stays in a file of its own on this machine (:func:`shape_key`), never in the recording.

The recording is append-only JSONL, written ``0600``; a request's line is flushed before its answer ends for the
client (the response's last bytes, a stream's ``data: [DONE]``), so a proxy killed with SIGKILL the moment a
client has its answer leaves that request readable. A request body that is not JSON, or larger than ``max_body``, is refused
with an OpenAI-style error and forwarded nowhere. When the upstream dies mid-stream the client gets an OpenAI-style
error event and the stream ends; when the client disconnects, the upstream request is closed (llama-server stops
generating for a closed connection).

Served and forwarded with aiohttp (its server and its client: one HTTP stack, no parsing by hand). Listens on
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from xover.client.chat import parse_chat_stream
from xover.client.http import LlamaClient, RequestError
from xover.domain.records import ServerTimings
from xover.domain.server_log import parse_log, session_lines
from xover.domain.sse import parse_completion_stream, timings_from_json
from xover.domain.turn_shape import block_hash, blocks_to_count, shape_of
from xover.domain.workload import FORMAT
from xover.errors import XoverError
from xover.paths import cache_root

MAX_BODY = 32 << 20  # bytes: larger requests are refused (a 128K-token prompt of code is about 0.5 MB)
CHAT = "/v1/chat/completions"
COMPLETIONS = ("/v1/completions", "/completion")
PASS_GET = ("/v1/models", "/health", "/props", "/models")
# hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself
_DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
         "proxy-authorization", "proxy-authenticate", "accept-encoding", "content-encoding"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Seen:
    """One request as the proxy saw it: what the server's timings said, and the client's clocks."""

    path: str
    stream: bool
    status: int
    arrived_unix_ns: int
    since_previous_s: float | None  # from the previous request's arrival; None for the first
    prompt_tokens: int | None
    cached_tokens: int | None
    answer_tokens: int | None
    ttft_s: float | None  # arrival to the first generated text passed on
    decode_tps: float | None  # as the client saw it: answer tokens after the first over their time
    server_prompt_tps: float | None
    server_decode_tps: float | None
    error: str | None

    def to_body(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shape_key(path: Path | None = None) -> bytes:
    """The key of a shape-only recording's hashes: ``path``, else ``record.key`` in xover's cache; made (32 random
    bytes, ``0600``) where it does not exist. The same key makes the same hashes, so recordings made with it can be
    compared; it never goes into a recording."""
    path = path or cache_root() / "record.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
    key = path.read_bytes()
    if len(key) < 16:
        raise XoverError(f"the shape key {path} holds {len(key)} bytes, fewer than 16: delete it to make a new one")
    return key


class Recording:
    """The recording file: a header line when it is new, then one line a request, each flushed as it is written;
    created ``0600`` (it holds the user's code and prompts, or with a ``key`` only their shapes)."""

    def __init__(self, path: Path, upstream: str, key: bytes | None = None) -> None:
        self.path = path
        self.key = key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _drop_cut_line(path)
        self._f = os.fdopen(fd, "a", encoding="utf-8")
        self.turns = 0
        if path.stat().st_size == 0:
            recorder: dict[str, Any] = {"upstream": upstream, "max_body": MAX_BODY}
            if key is not None:
                recorder |= {"shape_only": True, "key_id": hashlib.sha256(key).hexdigest()[:8]}
            self._write({"format": FORMAT, "recorder": recorder})
        else:
            lines = path.read_text(encoding="utf-8").splitlines()
            self.turns = sum(1 for line in lines if _is_turn(line))
            if self.turns and _is_shape(next(x for x in lines if _is_turn(x))) != (key is not None):
                have = "shape-only" if key is None else "full"
                raise XoverError(f"{path} holds {have} turns: record into a new file, or drop/add --shape-only")

    def _write(self, obj: Mapping[str, Any]) -> None:
        self._f.write(json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._f.flush()

    def turn(
        self, messages: list[Any], reply: str, seen: Seen, blocks: Mapping[str, tuple[int, str]] | None = None
    ) -> None:
        """One chat turn: its messages and reply, or with a key their shapes (``blocks`` holds every block's token
        length and hash, :func:`~xover.domain.turn_shape.blocks_to_count`)."""
        line: dict[str, Any] = {"turn": self.turns, "recorded": seen.to_body()}
        if self.key is None:
            line |= {"messages": messages, "assistant": reply}
        else:
            assert blocks is not None
            line |= {"shape": shape_of(messages, blocks), "assistant": list(blocks[reply])}
        self._write(line)
        self.turns += 1

    def event(self, seen: Seen) -> None:
        self._write({"event": "request", "recorded": seen.to_body()})

    def close(self) -> None:
        self._f.close()


def _drop_cut_line(path: Path) -> None:
    """A line a kill cut mid-write (no newline at the end) is dropped: the recording goes on after its whole lines."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


def _is_shape(line: str) -> bool:
    return "shape" in json.loads(line)


def _is_turn(line: str) -> bool:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:  # a line cut by a kill: the next turn is numbered after the whole ones
        return False
    return isinstance(obj, dict) and "turn" in obj


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _sse_error(message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "upstream_error", "code": 502}})
    return f"data: {body}\n\n".encode()


_DONE = b"data: [DONE]"


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP}


def _seen(path: str, stream: bool, status: int, arrived: tuple[int, int], since: float | None,
          chunks: list[tuple[int, bytes]], error: str | None) -> tuple[Seen, str]:  # fmt: skip
    """What one forwarded request said: its timings from the stream or the JSON body, and the reply's text."""
    t0 = arrived[1]
    reply, timings, prompt, cached, answer, first, last = "", None, None, None, None, None, None
    if stream and path == CHAT:
        s = parse_chat_stream(chunks, t0, error)
        reply, timings, first, last = s.content, s.timings, s.first_token_ns, s.last_token_ns
        prompt, cached, answer = s.prompt_tokens, s.cached_tokens, s.completion_tokens
    elif stream:
        c = parse_completion_stream(chunks, t0, error)
        timings, first = c.timings, c.first_token_ns
        last = c.token_times_ns[-1] if c.token_times_ns else None
        answer = len(c.token_times_ns) or None
    else:
        reply, timings, prompt, answer = _json_answer(b"".join(b for _, b in chunks))
        first = last = (chunks[-1][0] - t0) if chunks else None
    if timings is not None:
        prompt = prompt if prompt is not None else _sum(timings.cache_n, timings.prompt_n)
        cached = cached if cached is not None else timings.cache_n
        answer = answer if answer is not None else timings.predicted_n
    decode = None
    if stream and answer and answer > 1 and first is not None and last is not None and last > first:
        decode = (answer - 1) / ((last - first) / 1e9)
    seen = Seen(
        path=path,
        stream=stream,
        status=status,
        arrived_unix_ns=arrived[0],
        since_previous_s=since,
        prompt_tokens=prompt,
        cached_tokens=cached,
        answer_tokens=answer,
        ttft_s=first / 1e9 if first is not None else None,
        decode_tps=decode,
        server_prompt_tps=timings.prompt_per_second if timings else None,
        server_decode_tps=timings.predicted_per_second if timings else None,
        error=error if error is not None or status < 400 else f"HTTP {status}",
    )
    return seen, reply


def _sum(a: int | None, b: int | None) -> int | None:
    return a + b if a is not None and b is not None else None


def _json_answer(body: bytes) -> tuple[str, ServerTimings | None, int | None, int | None]:
    """A non-streamed answer's text, timings, prompt and answer tokens (chat or completion JSON)."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "", None, None, None
    if not isinstance(obj, dict):
        return "", None, None, None
    text = ""
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        msg = choices[0].get("message")
        text = str(msg.get("content") or "") if isinstance(msg, dict) else str(choices[0].get("text") or "")
    elif isinstance(obj.get("content"), str):
        text = obj["content"]
    usage: dict[str, Any] = obj["usage"] if isinstance(obj.get("usage"), dict) else {}
    prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    answer = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    timings = timings_from_json(obj["timings"], prompt) if isinstance(obj.get("timings"), dict) else None
    return text, timings, prompt, answer


class Proxy:
    """The pass-through: one aiohttp client session to ``upstream`` (opened with the app), the recording, and the
    clock of the previous request. The client is aiohttp's rather than httpx's for the time it adds: through httpx
    the relay added about 0.9 ms more to each TTFT (benchmarks/record_overhead.py)."""

    def __init__(self, upstream: str, recording: Recording, max_body: int = MAX_BODY,
                 on_seen: Callable[[Seen], None] | None = None) -> None:  # fmt: skip
        self.upstream = upstream.rstrip("/")
        self.recording = recording
        self.max_body = max_body
        self.on_seen = on_seen or (lambda seen: None)
        self._session: aiohttp.ClientSession | None = None
        self._warming: set[asyncio.Task[None]] = set()
        self.tokenizer = LlamaClient(self.upstream, timeout_s=120.0)
        self._tokens: dict[str, int] = {}  # a block's hash -> its tokens (shape-only: each block is asked once)
        self._previous: int | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        for path in (CHAT, *COMPLETIONS):
            app.router.add_post(path, self.forward)
        for path in PASS_GET:
            app.router.add_get(path, self.pass_get)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        # bytes as they come (no decompression), no timeout but the connection's: an answer may take minutes
        self._session = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, connect=10.0)
        )
        self._warm()

    async def _close(self, app: web.Application) -> None:
        for task in list(self._warming):
            task.cancel()
        if self._session is not None:
            await self._session.close()
        await self.tokenizer.aclose()
        self.recording.close()

    async def _send(self, method: str, request: web.Request, body: bytes | None = None) -> aiohttp.ClientResponse:
        """``request`` sent on to the upstream (its body ``body``), its answer not yet read; once more on a new
        connection where the kept-alive one was dead: llama-server may close a kept-alive connection unasked, and
        the next request on it fails before the server sees it (``Server disconnected``), so sending it again is
        safe. Timeouts and a refused connection are not retried."""
        assert self._session is not None, "the proxy's app was not started"
        url, headers = self.upstream + request.path_qs, _headers(request.headers)
        try:
            return await self._session.request(method, url, data=body, headers=headers)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            return await self._session.request(method, url, data=body, headers=headers)

    async def pass_get(self, request: web.Request) -> web.Response:
        try:
            up = await self._send("GET", request)
            async with up:
                content = await up.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            return openai_error(502, f"upstream {self.upstream} did not answer: {type(e).__name__}", "upstream_error")
        return web.Response(body=content, status=up.status, headers=_headers(up.headers))

    async def forward(self, request: web.Request) -> web.StreamResponse:
        arrived = (time.time_ns(), time.perf_counter_ns())
        since = (arrived[1] - self._previous) / 1e9 if self._previous is not None else None
        self._previous = arrived[1]
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, f"request body over {self.max_body:,} bytes: refused, forwarded nowhere")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return openai_error(400, f"request body is not JSON ({e}): refused, forwarded nowhere")
        if not isinstance(body, dict):
            return openai_error(400, "request body is not a JSON object: refused, forwarded nowhere")
        stream = bool(body.get("stream"))
        try:
            up = await self._send("POST", request, raw)
        except (aiohttp.ClientError, TimeoutError) as e:
            return openai_error(502, f"upstream {self.upstream} did not answer: {type(e).__name__}", "upstream_error")
        resp, chunks, error, held = await self._relay(request, up)
        seen, reply = _seen(request.path, stream, up.status, arrived, since, chunks, error)
        # a turn is a completed answer; one that broke is kept as an event with its error
        if request.path == CHAT and isinstance(body.get("messages"), list) and seen.error is None:
            try:
                self.recording.turn(body["messages"], reply, seen, await self._token_lengths(body["messages"], reply))
            except RequestError as e:  # the answer went back; only its shape is lost
                self.recording.event(dataclasses.replace(seen, error=f"shape-only: no token lengths ({e})"))
        else:
            self.recording.event(seen)
        self.on_seen(seen)
        # the answer ends for the client only now, after its line is on disk: a proxy killed the moment the client
        # has its answer has already recorded it
        if error is None or not error.startswith("client"):
            if held:
                await _quietly(lambda: resp.write(held))
            await _quietly(resp.write_eof)
        if stream:  # a whole answer leaves its connection open for the next request
            self._warm()
        return resp

    def _warm(self) -> None:
        """A spare connection to the upstream, opened now for the next request: llama-server closes a connection
        after a streamed answer, and a new one costs the next request's TTFT about half a millisecond. A ``GET
        /health`` (which llama-server neither logs nor queues) leaves a kept-alive connection in the pool; it stays
        there for the server's keep-alive time (5 s in llama.cpp's HTTP library), so a request after a longer pause
        connects anew."""
        task = asyncio.get_running_loop().create_task(self._health())
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)

    async def _health(self) -> None:
        assert self._session is not None
        try:
            async with self._session.get(self.upstream + "/health") as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError):
            pass  # the next request connects as it would have anyway

    async def _token_lengths(self, messages: list[Any], reply: str) -> dict[str, tuple[int, str]] | None:
        """Shape-only: every block's length in the upstream's tokens and its hash; a block not seen before is
        tokenized once its answer's last token has gone to the client (the answer's end waits for its line)."""
        key = self.recording.key
        if key is None:
            return None
        out = {}
        for text in blocks_to_count(messages, reply):
            h = block_hash(key, text)
            if h not in self._tokens:
                self._tokens[h] = len(await self.tokenizer.tokenize(text, add_special=False)) if text else 0
            out[text] = (self._tokens[h], h)
        return out

    async def _relay(
        self, request: web.Request, up: aiohttp.ClientResponse
    ) -> tuple[web.StreamResponse, list[tuple[int, bytes]], str | None, bytes]:
        """Every chunk of ``up`` to the client as it arrives; the response, the chunks with their arrival times, what
        broke, and the bytes held back: a stream's ``data: [DONE]`` and what follows, which end the answer for a client
        that stops reading there, go out only after the turn is recorded (the events before it, the last tokens and
        the timings, go at once)."""
        resp = web.StreamResponse(status=up.status, headers=_headers(up.headers))
        chunks: list[tuple[int, bytes]] = []
        held = b""
        line_start = True  # the next byte starts a line
        sse = "text/event-stream" in up.headers.get("content-type", "")
        error = await _to_client(resp.prepare(request))
        broke_after_end = False
        pending = b""  # a line's start that may be the start of [DONE]: it goes with the next read
        try:
            while error is None and (read := await up.content.readany()):
                chunks.append((time.perf_counter_ns(), read))
                chunk, pending = pending + read, b""
                if sse and not held and (at := _done_at(chunk, line_start)) >= 0:  # what comes before it goes now
                    chunk, held = chunk[:at], chunk[at:]
                elif sse and not held and (at := _done_begins(chunk, line_start)) >= 0:
                    chunk, pending = chunk[:at], chunk[at:]
                elif held:
                    held, chunk = held + chunk, b""
                line_start = True if pending else chunk.endswith(b"\n") if chunk else line_start
                if chunk:
                    error = await _to_client(resp.write(chunk))  # the client left: the upstream is dropped below
            if pending and error is None:  # the stream ended on it: it was not [DONE]
                error = await _to_client(resp.write(pending))
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            if pending:
                await _quietly(lambda: resp.write(pending))
            if held:  # after the stream's end ([DONE] is in hand): the answer is whole, nothing of it was lost; the
                # event ends with its blank line, even where the break came before it
                broke_after_end = True
                held = held if held.endswith(b"\n\n") else held.rstrip(b"\r\n") + b"\n\n"
            else:  # the upstream died mid-answer: the client hears it, OpenAI-style
                error = f"upstream broke after {sum(len(c) for _, c in chunks):,} bytes: {type(e).__name__}"
                await _tell(resp, up, error)
        finally:
            if error is None and not broke_after_end:
                up.release()  # read to its end: the connection goes back to the pool
            else:
                up.close()  # the connection is dropped: llama-server stops generating for a closed one
        return resp, chunks, error, held


async def _tell(resp: web.StreamResponse, up: aiohttp.ClientResponse, error: str) -> None:
    if "text/event-stream" in up.headers.get("content-type", ""):
        await _quietly(lambda: resp.write(_sse_error(error)))


def _done_at(chunk: bytes, line_start: bool) -> int:
    """Where a line ``data: [DONE]`` starts in ``chunk`` (``line_start``: the chunk starts a line), or -1. A JSON
    event holds no raw newline, so the same text inside an answer's content is never taken for it."""
    if line_start and chunk.startswith(_DONE):
        return 0
    at = chunk.find(b"\n" + _DONE)
    return at + 1 if at >= 0 else -1


def _done_begins(chunk: bytes, line_start: bool) -> int:
    """Where a line at the end of ``chunk`` starts that is the beginning of ``data: [DONE]`` but not all of it (the
    rest may come in the next read), or -1."""
    for n in range(min(len(_DONE) - 1, len(chunk)), 0, -1):
        at = len(chunk) - n
        if _DONE.startswith(chunk[at:]) and (chunk[at - 1 : at] == b"\n" if at else line_start):
            return at
    return -1


async def _to_client(write: Awaitable[Any]) -> str | None:
    """What broke writing to the client (it left), or None."""
    try:
        await write
    except (ConnectionResetError, ConnectionError) as e:
        return f"client disconnected ({type(e).__name__})"
    return None


async def _quietly(call: Callable[[], Awaitable[Any]]) -> None:
    try:
        await call()
    except (ConnectionResetError, ConnectionError):
        pass


def import_log(log: Path, out: Path) -> tuple[str, int]:
    """``xover record --from-log``: the requests of a llama-server's log (llama.cpp or ik_llama.cpp) as a shape-only
    recording at ``out`` (new, ``0600``); the log's engine and the turns written."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise XoverError(f"cannot read the log {log} ({e.strerror}): give llama-server's log file") from None
    engine, requests = parse_log(text, str(log))
    if out.exists() and out.stat().st_size:
        raise XoverError(f"{out} exists: give --out a new file (a log is imported whole, not appended)")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for line in session_lines(engine, requests, log.name):
            f.write(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n")
    return engine, len(requests)


def serve(upstream: str, out: Path, host: str = "127.0.0.1", port: int = 8090, max_body: int = MAX_BODY,
          on_seen: Callable[[Seen], None] | None = None, on_ready: Callable[[str], None] | None = None,
          key: bytes | None = None) -> None:  # fmt: skip
    """Run the proxy until interrupted; the recording is complete up to the last finished request. With ``key``
    the recording is shape-only (:func:`shape_key`)."""
    if not upstream.startswith(("http://", "https://")):
        raise XoverError(f"--upstream {upstream!r} is not a URL: give the llama-server's, e.g. http://127.0.0.1:8080")
    proxy = Proxy(upstream, Recording(out, upstream, key), max_body, on_seen)

    async def ready(app: web.Application) -> None:
        if on_ready is not None:
            on_ready(f"http://{host}:{port}")

    app = proxy.app()
    app.on_startup.append(ready)
    web.run_app(app, host=host, port=port, print=None, handle_signals=True, loop=_event_loop())


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's where it is installed (about 0.2 ms less added to each TTFT, benchmarks/record_overhead.py), else
    asyncio's own."""
    try:
        import uvloop  # local: optional (none on Windows)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
