"""Streaming HTTP client for llama-server: timestamps raw bytes as they arrive, nothing else.

One :class:`LlamaClient` talks to one server (its base URL). The transport is injectable
(``httpx.MockTransport`` or any ``httpx.AsyncBaseTransport``) so tests can feed streamed bodies
with real timing. An API key, when given, is sent only as a bearer header to that base URL.

Clocks: ``time.time_ns()`` says when a request was sent; ``time.perf_counter_ns()`` measures every
duration. The streaming loop only appends ``(perf_counter_ns, raw_bytes)``; :mod:`xover.domain.sse`
turns that list into events afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from xover.domain.sse import Chunk, CompletionStream, parse_completion_stream
from xover.errors import XoverError


class RequestError(XoverError):
    """A request to the server failed (HTTP error, broken stream, malformed event)."""


@dataclasses.dataclass(frozen=True)
class StreamRecord:
    """One streamed request: when it was sent, its raw chunks, and what they said."""

    sent_at_unix_ns: int
    t0_ns: int  # perf_counter_ns just before the request was handed to the transport
    status: int | None
    chunks: tuple[Chunk, ...]
    result: CompletionStream


def completion_body(
    prompt: tuple[int, ...] | str, n_predict: int, *, cache_prompt: bool, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The native ``/completion`` request xover sends: streamed, exactly ``n_predict`` tokens back."""
    body: dict[str, Any] = {
        "prompt": list(prompt) if isinstance(prompt, tuple) else prompt,
        "n_predict": n_predict,
        "stream": True,
        "ignore_eos": True,  # the response is exactly n_predict tokens long, whatever the model says
        "cache_prompt": cache_prompt,
    }
    body.update(extra or {})
    return body


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Client = TypeVar("_Client", bound="LlamaClient")
_Parsed = TypeVar("_Parsed", bound="DataclassInstance")


class LlamaClient:
    """Async client for one llama-server. Use as ``async with LlamaClient(url) as c``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 3600.0,
        explain: Callable[[], str | None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # what the server's side knows about a failed request (a llama-server that aborted), added to its error
        self._explain = explain
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # One connection at a time, opened before a measured request starts its clock (see
        # stream_completion); never through a proxy from the environment, which would be measured too.
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            trust_env=False,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1),
        )

    async def __aenter__(self: _Client) -> _Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def _fail(self, what: str, detail: str) -> RequestError:
        return RequestError(f"{what} {self.base_url}: {detail}")

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A plain (non-streamed) request, sent a second time if the kept-alive connection was dead.

        llama-server closes the connection after every streamed response without announcing it
        (its stream provider ends by returning false, which cpp-httplib treats as an error; no
        ``Connection: close`` header). A request that follows one on the same connection can
        meet ``Server disconnected without sending a response``; the server never saw it, so
        sending it again on a new connection is safe. Timeouts are not retried.
        """
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise
        except httpx.TransportError:
            return await self._http.request(method, path, **kwargs)

    async def get_json(self, path: str) -> Any:
        try:
            r = await self._request("GET", path)
        except httpx.HTTPError as e:
            raise self._fail(f"GET {path} at", f"{type(e).__name__}: {e}") from None
        return self._json(r, f"GET {path} at")

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        try:
            r = await self._request("POST", path, json=body)
        except httpx.HTTPError as e:
            raise self._fail(f"POST {path} at", f"{type(e).__name__}: {e}") from None
        return self._json(r, f"POST {path} at")

    def _json(self, r: httpx.Response, what: str) -> Any:
        if r.status_code != 200:
            raise self._fail(what, f"HTTP {r.status_code}: {error_text(r.content)}")
        try:
            return r.json()
        except ValueError:
            raise self._fail(what, f"response is not JSON: {r.content[:80]!r}") from None

    async def health(self) -> tuple[int | None, str]:
        """(HTTP status or None when unreachable, short reason) of ``/health``."""
        try:
            r = await self._request("GET", "/health", timeout=5.0)
        except httpx.HTTPError as e:
            return None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return r.status_code, error_text(r.content)

    async def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """The server's tokens for ``text``; ``add_special`` as ``/completion`` applies it to text prompts."""
        out = await self.post_json("/tokenize", {"content": text, "add_special": add_special})
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(tokens, list):
            raise self._fail("POST /tokenize at", "no 'tokens' list in the response")
        return [int(t) for t in tokens]

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (``/detokenize``)."""
        out = await self.post_json("/detokenize", {"tokens": list(tokens)})
        content = out.get("content") if isinstance(out, dict) else None
        if not isinstance(content, str):
            raise self._fail("POST /detokenize at", "no 'content' string in the response")
        return content

    async def stream_raw(self, path: str, body: dict[str, Any]) -> RawStream:
        """POST a streamed request to ``path``; every body chunk is timestamped on arrival.

        Never raises for what the server does: a refused connection, an HTTP error or a cut
        stream ends up in ``error``/``transport_error`` beside every chunk that arrived before it.
        """
        try:
            # The connection a previous stream used is dead (see _request): open a new one now,
            # outside the clock, with a request whose plain response keeps it alive for this one.
            await self._request("GET", "/health", timeout=10.0)
        except httpx.HTTPError as e:
            return RawStream(
                time.time_ns(), time.perf_counter_ns(), None, (), f"no connection: {type(e).__name__}: {e}", None
            )
        # Everything that can be prepared is prepared before the clock starts (JSON, URL, headers).
        request = self._http.build_request(
            "POST", path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        chunks: list[Chunk] = []
        append = chunks.append
        clock = time.perf_counter_ns
        status: int | None = None
        error_body = b""
        transport_error: str | None = None
        sent_at = time.time_ns()
        t0 = clock()
        try:
            r = await self._http.send(request, stream=True)
            try:
                status = r.status_code
                if status == 200:
                    async for raw in r.aiter_raw():
                        append((clock(), raw))
                else:
                    error_body = await r.aread()
            finally:
                await r.aclose()
        except httpx.HTTPError as e:
            transport_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        error = None
        if status != 200:
            error = (
                f"HTTP {status}: {error_text(error_body)}" if status is not None else f"no response: {transport_error}"
            )
        why = self._explain() if self._explain is not None and (error or transport_error) else None
        if why:
            error, transport_error = (f"{e} ({why})" if e else e for e in (error, transport_error))
        return RawStream(sent_at, t0, status, tuple(chunks), error, transport_error)

    async def _stream_parsed(
        self, path: str, body: dict[str, Any], parse: Callable[[Sequence[Chunk], int, str | None], _Parsed]
    ) -> tuple[RawStream, _Parsed]:
        """POST ``path`` streamed (see :meth:`stream_raw`) and ``parse`` its chunks (sent at ``t0_ns``; the
        transport error, if the stream broke); a request that got no stream parses as nothing, with its error."""
        raw = await self.stream_raw(path, body)
        if raw.error is None:
            return raw, parse(raw.chunks, raw.t0_ns, raw.transport_error)
        return raw, dataclasses.replace(parse((), raw.t0_ns, None), error=raw.error)

    async def stream_completion(self, body: dict[str, Any]) -> StreamRecord:
        """POST ``/completion`` with ``stream: true`` (see :meth:`stream_raw`) and parse the events."""
        raw, result = await self._stream_parsed("/completion", body, parse_completion_stream)
        return StreamRecord(
            sent_at_unix_ns=raw.sent_at_unix_ns, t0_ns=raw.t0_ns, status=raw.status, chunks=raw.chunks, result=result
        )


@dataclasses.dataclass(frozen=True)
class RawStream:
    """One streamed request as it arrived: chunks stamped with ``perf_counter_ns``, nothing parsed."""

    sent_at_unix_ns: int
    t0_ns: int  # perf_counter_ns when the request was sent
    status: int | None
    chunks: tuple[Chunk, ...]
    error: str | None  # no connection, an HTTP error status or no response at all; None for a 200
    transport_error: str | None  # the stream broke after a 200


def error_text(body: bytes) -> str:
    """One line from an error body: llama-server's ``{"error": {"message": ...}}`` or the raw start."""
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:120].decode("utf-8", "replace").strip().replace("\n", " ") or "(empty body)"
    if isinstance(obj, dict) and "error" in obj:
        err = obj["error"]
        return str(err.get("message", err)) if isinstance(err, dict) else str(err)
    if isinstance(obj, dict) and "status" in obj:
        return str(obj["status"])
    return json.dumps(obj)[:120]


async def wait_healthy(
    client: LlamaClient, timeout_s: float, *, check_alive: Callable[[], None] | None = None, poll_s: float = 0.05
) -> None:
    """Poll ``/health`` until it answers 200 (503 means loading); raise with the last answer on timeout.

    ``check_alive`` raises when the server process has died (so an early crash is reported at once,
    not after the timeout).
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while True:
        if check_alive is not None:
            check_alive()
        status, reason = await client.health()
        if status == 200:
            return
        last = f"HTTP {status} {reason}" if status is not None else reason
        if time.monotonic() >= deadline:
            raise RequestError(
                f"{client.base_url} did not become healthy within {timeout_s:g} s (last /health: {last}); "
                "give it longer (--server-timeout) or check that it is a llama-server"
            )
        await asyncio.sleep(poll_s)
