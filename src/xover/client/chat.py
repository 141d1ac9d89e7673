"""The OpenAI-style chat protocol of llama-server: the streamed ``/v1/chat/completions`` request xover sends,
what its stream says (pure), and :class:`ChatClient`, which adds the chat endpoint, ``/apply-template`` and
prompt tokenization to :class:`xover.client.http.LlamaClient`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from xover.client.http import LlamaClient
from xover.domain.records import ServerTimings
from xover.domain.sse import Chunk, event_json, stream_events, timings_from_json, unfinished


def chat_body(messages: Sequence[Mapping[str, Any]], max_tokens: int, *, cache_prompt: bool) -> dict[str, Any]:
    """The streamed chat request: exactly ``max_tokens`` back (``ignore_eos``), greedy, usage included."""
    return {
        "messages": list(messages),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "cache_prompt": cache_prompt,
    }


# ---- the chat stream (pure) ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChatStream:
    """What a streamed ``/v1/chat/completions`` response said, client clocks as offsets from the send.

    ``first_token_ns`` is the first event carrying a ``delta`` (llama-server sends the role with the
    first generated token); ``last_token_ns`` the last one carrying text; ``end_ns`` the ``[DONE]``.
    """

    first_byte_ns: int | None
    first_token_ns: int | None
    last_token_ns: int | None
    end_ns: int | None
    content: str
    n_content_events: int
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    timings: ServerTimings | None
    error: str | None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def parse_chat_stream(chunks: Sequence[Chunk], t0_ns: int, transport_error: str | None = None) -> ChatStream:
    """Interpret the chunks of one streamed chat completion sent at ``t0_ns`` (perf_counter_ns).

    Chunks carry ``choices[0].delta`` (``role``, ``content``, ``reasoning_content``...), then one
    with ``finish_reason``, then (``include_usage``) one with empty ``choices``, ``usage`` and
    llama-server's ``timings``, then ``data: [DONE]``. Every way it can go wrong (cut, malformed
    event, error event, no ``[DONE]``, no timings) is a one-line ``error``; what came before is kept.
    """
    parsed, first_byte = stream_events(chunks, t0_ns)
    first = last = end = None
    content: list[str] = []
    finish: str | None = None
    usage: dict[str, Any] = {}
    timings: ServerTimings | None = None
    raw_timings: dict[str, Any] | None = None
    error: str | None = None
    for k, ev in enumerate(parsed.events, start=1):
        t = ev.t_ns - t0_ns
        if ev.data == "[DONE]":
            end = t
            break
        obj, error = event_json(k, ev.data, f"after {len(content)} text events")
        if error is None and not isinstance(obj, dict):
            error = f"malformed event #{k}: not a JSON object: {ev.data[:80]!r}"
        if error is not None:
            break
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict) and delta:
                first = t if first is None else first
                text = delta.get("content")
                if isinstance(text, str) and text:
                    content.append(text)
                    last = t
            if isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            raw_timings = obj["timings"]
    # usage may come in a later event than timings: its prompt tokens give the cached part where cache_n is absent
    prompt_tokens = usage.get("prompt_tokens")
    if raw_timings is not None:
        timings = timings_from_json(raw_timings, prompt_tokens if isinstance(prompt_tokens, int) else None)
    if error is None and end is None:
        error = unfinished(f"after {len(content)} text events", transport_error, parsed.trailing, "data: [DONE]")
    elif error is None and timings is None:
        error = "the stream carried no timings (is this llama-server?)"
    details = usage.get("prompt_tokens_details")
    return ChatStream(
        first_byte_ns=first_byte,
        first_token_ns=first,
        last_token_ns=last,
        end_ns=end,
        content="".join(content),
        n_content_events=len(content),
        finish_reason=finish,
        prompt_tokens=_int(usage.get("prompt_tokens")),
        cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
        completion_tokens=_int(usage.get("completion_tokens")),
        timings=timings,
        error=error,
    )


# ---- the chat client ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChatRecord:
    sent_at_unix_ns: int
    t0_ns: int
    status: int | None
    chunks: tuple[Chunk, ...]
    result: ChatStream


class ChatClient(LlamaClient):
    """:class:`LlamaClient` plus the chat endpoint, ``/apply-template`` and prompt tokenization."""

    async def apply_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        out = await self.post_json("/apply-template", {"messages": list(messages)})
        prompt = out.get("prompt") if isinstance(out, dict) else None
        if not isinstance(prompt, str):
            raise self._fail("POST /apply-template at", "no 'prompt' string in the response")
        return prompt

    async def prompt_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The tokens the chat endpoint evaluates for ``messages`` (template applied, specials parsed)."""
        return await self.tokenize(await self.apply_template(messages), add_special=True)

    async def stream_chat(self, body: dict[str, Any]) -> ChatRecord:
        """POST ``/v1/chat/completions`` streamed (timed like :meth:`LlamaClient.stream_raw`) and parse it."""
        raw, result = await self._stream_parsed("/v1/chat/completions", body, parse_chat_stream)
        return ChatRecord(
            sent_at_unix_ns=raw.sent_at_unix_ns, t0_ns=raw.t0_ns, status=raw.status, chunks=raw.chunks, result=result
        )
