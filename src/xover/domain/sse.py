"""Server-sent events: raw timestamped chunks in, llama-server completion results out. Pure.

The streaming loop in :mod:`xover.client.http` only appends ``(perf_counter_ns, raw_bytes)`` as chunks
arrive; everything here runs afterwards on that list, so parsing never delays a timestamp.

An event's time is the arrival time of the chunk holding the end of its terminating blank line:
the moment the client could first have acted on it.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

from xover.domain.records import ServerTimings

Chunk = tuple[int, bytes]  # (perf_counter_ns at arrival, raw bytes)

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclasses.dataclass(frozen=True)
class SseEvent:
    """One dispatched event (WHATWG SSE): ``data`` lines joined by newlines."""

    t_ns: int  # when its blank line arrived (perf_counter_ns)
    event: str
    data: str


@dataclasses.dataclass(frozen=True)
class SseParse:
    events: tuple[SseEvent, ...]
    trailing: bytes  # bytes after the last complete event (a stream cut mid-event leaves some)


def parse_sse(chunks: Sequence[Chunk]) -> SseParse:
    """Split a byte stream into events, each stamped with the arrival of the chunk that completed it.

    Follows the SSE field rules: ``data:`` lines accumulate, a blank line dispatches, ``:`` lines
    are comments (llama-server's idle pings), a single space after the colon is dropped, an event
    with no data is not dispatched, and an unterminated last event is left in ``trailing``.
    """
    buf = b"".join(c for _, c in chunks)
    ends: list[int] = []  # cumulative end offset of each chunk
    total = 0
    for _, c in chunks:
        total += len(c)
        ends.append(total)

    def time_at(offset: int) -> int:
        # the chunk containing byte ``offset - 1`` (the last byte of the terminating line break)
        return chunks[bisect.bisect_left(ends, offset)][0] if offset > 0 else chunks[0][0]

    events: list[SseEvent] = []
    data: list[bytes] = []
    event_type = b""
    pos = 0
    consumed = 0  # offset just past the last dispatched event (or ignorable blank line)
    for m in _EOL.finditer(buf):
        line = buf[pos : m.start()]
        pos = m.end()
        if not line:
            if data:
                events.append(
                    SseEvent(
                        t_ns=time_at(pos),
                        event=(event_type or b"message").decode("utf-8", "replace"),
                        data=b"\n".join(data).decode("utf-8", "replace"),
                    )
                )
            data, event_type = [], b""
            consumed = pos
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(value)
        elif field == b"event":
            event_type = value
        # "id" and "retry" mean nothing for a single request; unknown fields are ignored per the spec.
    return SseParse(events=tuple(events), trailing=buf[consumed:])


# ---- llama-server native /completion stream ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompletionStream:
    """What a streamed ``/completion`` response said, with client clocks as offsets from the send.

    ``token_times_ns[i]`` is when generated token ``i + 1`` became visible to the client. The server
    holds back a token that ends inside a UTF-8 character and releases it with the next event;
    ``tokens_predicted`` on each event says how many tokens it covers, so held-back tokens get the
    time of the event that released them. ``first_event_n_decoded`` above 1 means the first
    visible token came after that many decode steps, so TTFT includes the extra steps.
    """

    first_byte_ns: int | None
    first_token_ns: int | None
    end_ns: int | None  # arrival of the final event (``stop: true``)
    token_times_ns: tuple[int, ...]
    first_event_n_decoded: int | None
    timings: ServerTimings | None
    error: str | None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def timings_from_json(t: dict[str, Any], prompt_tokens: int | None = None) -> ServerTimings:
    """llama-server's ``timings`` object; absent fields stay None. ik_llama.cpp's server reports no ``cache_n``:
    with the request's prompt tokens (its final event's ``tokens_evaluated``, a chat's ``usage.prompt_tokens``) the
    cached part is what the server did not process, ``prompt_tokens - prompt_n``, so the same checks hold (cold:
    every token processed)."""
    cache_n = _int(t.get("cache_n"))
    prompt_n = _int(t.get("prompt_n"))
    if cache_n is None and prompt_tokens is not None and prompt_n is not None and 0 <= prompt_n <= prompt_tokens:
        cache_n = prompt_tokens - prompt_n
    return ServerTimings(
        cache_n=cache_n,
        prompt_n=prompt_n,
        prompt_ms=_float(t.get("prompt_ms")),
        prompt_per_second=_float(t.get("prompt_per_second")),
        predicted_n=_int(t.get("predicted_n")),
        predicted_ms=_float(t.get("predicted_ms")),
        predicted_per_second=_float(t.get("predicted_per_second")),
    )


def error_message(err: Any) -> str:
    """The message of an error event's ``error`` (its message or type, else all of it)."""
    if isinstance(err, dict):
        return str(err.get("message") or err.get("type") or err)
    return str(err)


def stream_events(chunks: Sequence[Chunk], t0_ns: int) -> tuple[SseParse, int | None]:
    """The events of a stream sent at ``t0_ns``, and when its first byte came after that (None: no bytes)."""
    parsed = parse_sse(chunks) if chunks else SseParse(events=(), trailing=b"")
    return parsed, chunks[0][0] - t0_ns if chunks else None


def event_json(k: int, data: str, where: str) -> tuple[Any, str | None]:
    """The JSON event ``k`` carries, and the one-line error it is (None: none): not JSON, or the server's
    error event; ``where`` says how far the stream had come (e.g. ``after 3 tokens``)."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return None, f"malformed event #{k} {where}: {data[:80]!r}"
    if isinstance(obj, dict) and "error" in obj:
        return obj, f"server error {where}: {error_message(obj['error'])}"
    return obj, None


def unfinished(where: str, transport_error: str | None, trailing: bytes, missing: str) -> str:
    """The one-line error of a stream that stopped ``where`` before ``missing`` (its last event) arrived."""
    if transport_error is not None:
        return f"stream broke {where}: {transport_error}"
    if trailing.strip():
        return f"stream ended mid-event {where}: {trailing[:80]!r}"
    return f"stream ended {where} without {missing}"


def parse_completion_stream(
    chunks: Sequence[Chunk], t0_ns: int, transport_error: str | None = None
) -> CompletionStream:
    """Interpret the chunks of one ``/completion`` stream sent at ``t0_ns`` (perf_counter_ns).

    Content events carry ``tokens`` (ids) and ``stop: false``; the final event has ``stop: true``
    and ``timings``; errors arrive as ``{"error": {...}}``. Every way a stream can go wrong (cut,
    malformed event, error event, missing final event) ends up as a one-line ``error``; whatever
    arrived before it is kept.
    """
    parsed, first_byte = stream_events(chunks, t0_ns)
    token_times: list[int] = []
    first_token: int | None = None
    first_event_n_decoded: int | None = None
    end: int | None = None
    timings: ServerTimings | None = None
    error: str | None = None
    for k, ev in enumerate(parsed.events, start=1):
        obj, error = event_json(k, ev.data, f"after {len(token_times)} tokens")
        if error is None and not isinstance(obj, dict):
            error = f"malformed event #{k} after {len(token_times)} tokens: not a JSON object: {ev.data[:80]!r}"
        if error is not None:
            break
        t = ev.t_ns - t0_ns
        tokens = obj.get("tokens")
        n_tokens = len(tokens) if isinstance(tokens, list) else (1 if obj.get("content") else 0)
        if n_tokens:
            decoded = _int(obj.get("tokens_predicted"))
            covered = max(decoded, len(token_times) + n_tokens) if decoded is not None else len(token_times) + n_tokens
            if first_token is None:
                first_token = t
                first_event_n_decoded = covered
            token_times.extend([t] * (covered - len(token_times)))
        if obj.get("stop") is True:
            end = t
            if isinstance(obj.get("timings"), dict):
                timings = timings_from_json(obj["timings"], _int(obj.get("tokens_evaluated")))
            break
    if error is None and end is None:
        error = unfinished(
            f"after {len(token_times)} tokens", transport_error, parsed.trailing, "the final event (stop: true)"
        )
    elif error is None and timings is None:
        error = "final event (stop: true) carried no timings"
    return CompletionStream(
        first_byte_ns=first_byte,
        first_token_ns=first_token,
        end_ns=end,
        token_times_ns=tuple(token_times),
        first_event_n_decoded=first_event_n_decoded,
        timings=timings,
        error=error,
    )
