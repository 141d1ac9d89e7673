"""Session replay, pure parts: the chat-stream parser (recorded llama-server streams), request bodies,
cache modes, context sizing, the chat client on a mock transport, storage, and the report section."""

from __future__ import annotations

import asyncio
import base64
import re
from pathlib import Path

import httpx
import pytest

from xover.client.chat import ChatClient, chat_body, parse_chat_stream
from xover.domain.records import ServerTimings, SessionTurn
from xover.errors import XoverError
from xover.measure.session import common_prefix, context_for, mode_settings, parse_modes
from xover.report.session import (
    session_section_html,
    session_section_markdown,
    session_table,
    session_verdict,
    turn_table,
)
from xover.results.read_model import SessionSeries, series_from_rows
from xover.results.store import Store

# Recorded from llama-server 0c1e570 (CPU, tiny-moe): /v1/chat/completions, max_tokens 3, include_usage.
# Offsets in ns from the send; "created"/"id"/"model"/"system_fingerprint" cut for length. The role
# delta and the first token arrive in one chunk.
_TAIL = b',"object":"chat.completion.chunk"}\n\n'
RECORDED = [
    (
        38_056_137,
        b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}]'
        + _TAIL
        + b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"<xover_pad_682>"}}]'
        + _TAIL,
    ),
    (39_512_714, b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"<xover_pad_283>"}}]' + _TAIL),
    (40_397_234, b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"<xover_pad_249>"}}]' + _TAIL),
    (
        41_115_964,
        b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}]'
        + _TAIL
        + b'data: {"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":95,"total_tokens":98,'
        b'"prompt_tokens_details":{"cached_tokens":94}},"timings":{"cache_n":94,"prompt_n":1,"prompt_ms":10.251,'
        b'"prompt_per_token_ms":10.251,"prompt_per_second":97.551458394303,"predicted_n":3,"predicted_ms":2.135,'
        b'"predicted_per_token_ms":1.0675,"predicted_per_second":936.768149882904}' + _TAIL,
    ),
    (41_398_482, b"data: [DONE]\n\n"),
]


def test_recorded_stream() -> None:
    r = parse_chat_stream(RECORDED, t0_ns=0)
    assert r.error is None
    assert r.first_byte_ns == r.first_token_ns == 38_056_137
    assert r.last_token_ns == 40_397_234 and r.end_ns == 41_398_482
    assert r.content == "<xover_pad_682><xover_pad_283><xover_pad_249>" and r.n_content_events == 3
    assert r.finish_reason == "length"
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (95, 94, 3)
    assert r.timings is not None and (r.timings.cache_n, r.timings.prompt_n, r.timings.predicted_n) == (94, 1, 3)
    assert r.cached_tokens == r.timings.cache_n


def test_split_anywhere_gives_the_same_result_with_the_completing_chunk_times() -> None:
    raw = b"".join(c for _, c in RECORDED)
    chunks = [(1000 + i, raw[i : i + 7]) for i in range(0, len(raw), 7)]
    r = parse_chat_stream(chunks, t0_ns=1000)
    assert r.error is None and r.content == parse_chat_stream(RECORDED, 0).content
    assert r.end_ns == len(raw) - 1 - (len(raw) - 1) % 7  # the chunk holding the last byte


@pytest.mark.parametrize(
    ("chunks", "transport", "match"),
    [
        (RECORDED[:3], None, "without data: \\[DONE\\]"),
        (RECORDED[:3], "ReadError: reset", "stream broke after 3 text events: ReadError"),
        ([*RECORDED[:2], (5, b'data: {"choi')], None, "mid-event"),
        ([*RECORDED[:1], (5, b"data: nope\n\n")], None, "malformed event #3"),
        (
            [(5, b'data: {"error": {"message": "context full"}}\n\n')],
            None,
            "server error after 0 text events: context full",
        ),
        ([(5, b"data: [1]\n\n")], None, "not a JSON object"),
        ([*RECORDED[:3], (9, b"data: [DONE]\n\n")], None, "no timings"),
    ],
)
def test_every_failure_is_one_line(chunks: list[tuple[int, bytes]], transport: str | None, match: str) -> None:
    r = parse_chat_stream(chunks, 0, transport)
    assert r.error is not None and re.search(match, r.error) and "\n" not in r.error


def test_empty_stream() -> None:
    r = parse_chat_stream((), 0)
    assert r.first_byte_ns is None and r.first_token_ns is None and r.error is not None


def test_request_body_and_cache_modes() -> None:
    body = chat_body([{"role": "user", "content": "x"}], 8, cache_prompt=False)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["ignore_eos"], body["cache_prompt"], body["temperature"]) == (8, True, False, 0.0)
    assert mode_settings("default") == mode_settings("default", 64)
    assert mode_settings("default").args == () and mode_settings("default").cache_prompt
    off = mode_settings("off")
    assert off.cold_cache and not off.cache_prompt
    assert mode_settings("reuse", 128).args == ("--cache-reuse", "128")
    with pytest.raises(XoverError, match="not one of"):
        mode_settings("warm")
    assert parse_modes("off, reuse") == ("off", "reuse")
    for bad in ("", "default,default", "cold"):
        with pytest.raises(XoverError):
            parse_modes(bad)


def test_common_prefix_and_context_sizing() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert context_for([1000, 2000, 2900], 64) == 3328  # 2900 + 64 + 256 = 3220, rounded up to 256
    assert context_for([1000, 2000, 2900], 64, reply_tokens=100) == 3584  # + 2 replies of 100: 3420


def test_chat_client_streams_through_a_mock_transport() -> None:
    seen: list[str] = []

    async def body():  # type: ignore[no-untyped-def]
        for _, chunk in RECORDED:
            yield chunk

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/apply-template":
            return httpx.Response(200, json={"prompt": "<|im_start|>user\nx<|im_end|>\n"})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1, 2, 3]})
        if b'"max_tokens": 500' in request.content:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return httpx.Response(200, content=body())

    async def go() -> tuple:  # type: ignore[type-arg]
        async with ChatClient("http://fake:1", transport=httpx.MockTransport(handler)) as c:
            ok = await c.stream_chat(chat_body([{"role": "user", "content": "x"}], 3, cache_prompt=True))
            bad = await c.stream_chat(chat_body([{"role": "user", "content": "x"}], 500, cache_prompt=True))
            tokens = await c.prompt_tokens([{"role": "user", "content": "x"}])
            return ok, bad, tokens

    ok, bad, tokens = asyncio.run(go())
    assert ok.status == 200 and ok.result.error is None and ok.result.content.count("<xover_pad_") == 3
    assert ok.t0_ns > 0 and ok.result.first_token_ns is not None and ok.result.first_token_ns >= 0
    assert bad.status == 500 and bad.result.error == "HTTP 500: boom"
    assert tokens == [1, 2, 3]
    assert seen[:2] == ["GET /health", "POST /v1/chat/completions"]  # a fresh connection before each stream


# ---- storage -------------------------------------------------------------------------------------


def _turn(
    i: int,
    *,
    key: str = "k1",
    mode: str = "default",
    ttft_ms: float = 100.0,
    total_ms: float = 200.0,
    cache_n: int = 0,
    prompt_n: int = 100,
    rewrite: bool = False,
    error: str | None = None,
    sid: str = "s1",
) -> SessionTurn:
    return SessionTurn(
        config_key=key,
        mode=mode,
        session_id=sid,
        feed="generated",
        turn=i,
        rewrite=rewrite,
        sent_at_unix_ns=10**18 + i,
        prompt_tokens=cache_n + prompt_n,
        prefix_tokens=None if i == 0 else cache_n,
        cached_tokens=cache_n,
        completion_tokens=8,
        first_byte_ns=round(ttft_ms * 1e6),
        first_token_ns=round(ttft_ms * 1e6),
        last_token_ns=round(total_ms * 1e6) - 1,
        end_ns=None if error else round(total_ms * 1e6),
        n_content_events=8,
        reply="<b>hi</b>",
        reply_tokens=30,
        timings=None if error else ServerTimings(cache_n, prompt_n, 1.0, 100.0, 8, 2.0, 400.0),
        error=error,
    )


def test_store_round_trips_session_turns(tmp_path: Path) -> None:
    from xover.domain.config import LlamaConfig
    from xover.measure.provenance import collect

    config = LlamaConfig("a", server_args=("--jinja",))
    key = config.key
    turns = [
        _turn(0, key=key),
        _turn(1, key=key, cache_n=100, prompt_n=20, rewrite=True),
        _turn(2, key=key, error="HTTP 500: boom"),
    ]
    with Store(tmp_path) as st:
        run = st.begin_run("session", ["xover", "session"], collect(None, None))
        st.put_config(config)
        for t in turns:
            st.add_session_turn(run, "model:1", t)
        back = st.session_turns()
    assert [t for _, _, _, t in back] == turns
    assert {(r, m) for _, r, m, _ in back} == {(run, "model:1")}


# ---- report --------------------------------------------------------------------------------------


def _series(
    label: str, mode: str, ttfts: list[float], *, run_id: int = 1, cache: int = 0
) -> list[tuple[int, str, SessionTurn]]:
    return [
        (
            run_id,
            label,
            _turn(i, key=label, mode=mode, ttft_ms=x, total_ms=x + 100, cache_n=cache * i, rewrite=(i == 2)),
        )
        for i, x in enumerate(ttfts)
    ]


def test_series_keep_the_latest_run_of_the_latest_workload() -> None:
    rows = (
        _series("a", "off", [900, 900, 900])
        + _series("a", "default", [500, 500, 500], run_id=1)
        + _series("a", "default", [100, 100, 100], run_id=2)
    )
    series = series_from_rows(rows)
    assert [(s.label, s.mode, s.run_id) for s in series] == [("a", "default", 2), ("a", "off", 1)]
    assert series[0].total_ns == 3 * 200_000_000
    other = rows + [(5, "b", _turn(0, key="b", sid="s2"))]
    assert [(s.label, s.session_id) for s in series_from_rows(other)] == [("b", "s2")]


def test_verdict_names_the_winner_and_compares_with_the_crossover() -> None:
    rows = (
        _series("ncmoe=12", "default", [300, 200, 200], cache=1000)
        + _series("ncmoe=18", "default", [200, 100, 100], cache=1000)
        + _series("ncmoe=12", "off", [300, 600, 900])
        + _series("ncmoe=18", "off", [400, 900, 1500])
    )
    series = series_from_rows(rows)
    v = session_verdict(series, crossover_tokens=1500)
    assert v is not None
    # ncmoe=18: 0.3 + 0.2 + 0.2 = 0.7 s; ncmoe=12: 0.4 + 0.3 + 0.3 = 1.0 s
    assert (
        "with llama-server's default prompt cache ncmoe=18 wins: 0.70 s in total against 1.00 s for ncmoe=12 (30% less)"
        in v
    )
    assert "3-turn" in v and "1 context rewrite)" in v
    assert "crossover is 1,500 tokens and 1 of 3 turns send longer prompts" in v  # prompts 100, 1100, 2100
    assert "median of 100 new tokens, below the crossover" in v
    assert "Against caching off the cache saves 77% of ncmoe=18's session time" in v  # 0.7 vs 3.1 s
    assert (
        "caching off (every turn a cold prefill) ncmoe=12 wins (2.10 s), not ncmoe=18: the cache changes the answer"
        in v
    )
    assert session_verdict(series) is not None and "crossover" not in (session_verdict(series) or "")


def test_verdict_needs_a_complete_replay() -> None:
    rows = [(1, "a", _turn(0, key="a")), (1, "a", _turn(1, key="a", error="cut"))]
    series = series_from_rows(rows)
    assert series[0].total_ns is None and session_verdict(series) is None
    header, table = session_table(series)
    assert "incomplete" in table[0][2] and table[0][3] == "-"


def test_tables_and_sections_escape_text() -> None:
    rows = _series("<script>x</script>", "default", [100, 200, 300], cache=50) + _series("b&c", "reuse", [90, 90, 90])
    series = series_from_rows(rows)
    header, table = turn_table(series)
    assert header[-2:] == [
        "<script>x</script> default: TTFT ms (cache_n/prompt_n)",
        "b&c reuse: TTFT ms (cache_n/prompt_n)",
    ]
    assert table[2][:4] == ["2", "200", "100", "yes"] and table[2][4] == "300.0 (100/100)"
    html = session_section_html(series, crossover_tokens=1000)
    assert "<script>x" not in html and "&lt;script&gt;x&lt;/script&gt;" in html and "b&amp;c" in html
    png = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", html).group(1))  # type: ignore[union-attr]
    assert png.startswith(b"\x89PNG")
    md = session_section_markdown(series)
    assert md.startswith("## Agentic session replay") and "| turn | prompt tokens |" in md
    assert "No session replayed" in session_section_html([]) and "no session replayed" in session_section_markdown([])


def test_series_of_constructed_turns_sum_turn_times() -> None:
    s = SessionSeries(1, "a", "default", "s", "generated", (_turn(0, total_ms=100), _turn(1, total_ms=250)))
    assert s.complete and s.total_ns == 350_000_000 and s.cumulative_s() == [0.1, 0.35]


def test_write_workload_names_the_spec_and_is_idempotent(tmp_path: Path) -> None:
    from xover.domain.workload import WorkloadSpec, dumps, generate
    from xover.measure.session import write_workload

    spec = WorkloadSpec(seed=4, turns=3, system_tokens=512, target_tokens=2048, chars_per_token=1.0)
    path = write_workload(tmp_path / "study", spec)
    assert path.name == "session-seed4-turns3-sys512-target2048-rw6-cpt1.jsonl"
    first = path.read_bytes()
    assert write_workload(tmp_path / "study", spec).read_bytes() == first == dumps(generate(spec)).encode()


def test_replayed_turns_are_shown_against_the_cached_turns_prediction() -> None:
    """Turns served from the cache (cache_n > 0) beside the cached turns' fit for their new tokens: a fit of 1 ms a
    new token predicts 20 ms for 20 new tokens, and a turn of 30 ms is 1.5x it; the cold first turn, the failed
    turn and the cache-off replay are left out."""
    from xover.report.session import against_cached, session_section_markdown

    on = SessionSeries(
        1,
        "a",
        "default",
        "s",
        "generated",
        (
            _turn(0, ttft_ms=500.0),
            _turn(1, cache_n=100, prompt_n=20, ttft_ms=30.0),
            _turn(2, cache_n=140, prompt_n=40, ttft_ms=40.0),
            _turn(3, error="HTTP 500: boom"),
        ),
    )
    off = SessionSeries(2, "a", "off", "s", "generated", (_turn(0), _turn(1, prompt_n=120)))
    cached = ({"a": lambda n: n / 1000.0}, 2048)
    header, rows, summary = against_cached([on, off], *cached)
    assert [r[2] for r in rows] == ["1", "2"] and [r[-1] for r in rows] == ["1.50", "1.00"]
    assert header[-1] == "measured / predicted" and rows[0][3:7] == ["100", "20", "30.0", "20.0"]
    assert summary == [
        "a (default): the replayed turns took 1.25x what its cached turns on a 2,048-token context predict for their "
        "new tokens (median of 2 turns, 1.00-1.50)"
    ]
    md = session_section_markdown([on, off], cached=cached)
    assert "### Against the cached turns" in md and summary[0] in md
    assert "Against the cached turns" not in session_section_markdown([on, off])
