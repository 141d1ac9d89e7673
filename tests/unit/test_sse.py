"""The SSE parser and the llama-server stream interpreter, on recorded and constructed streams."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from xover.domain.sse import SseEvent, parse_completion_stream, parse_sse

# Recorded from llama-server 0c1e570 (CPU, tiny-moe): prompt [300, 301, 302, 303], n_predict 3,
# cache_prompt false. Offsets in ns from the send; the final event's generation_settings and
# prompt are cut for length.
RECORDED = [
    (
        4_910_589,
        b'data: {"index":0,"content":"*","tokens":[42],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":4}\n\n',
    ),
    (
        5_745_878,
        b'data: {"index":0,"content":"\\\\","tokens":[92],"stop":false,"id_slot":-1,"tokens_predicted":2,"tokens_evaluated":4}\n\n',
    ),
    (
        13_047_267,
        b'data: {"index":0,"content":"\xef\xbf\xbd","tokens":[136],"stop":false,"id_slot":-1,"tokens_predicted":3,"tokens_evaluated":4}\n\n',
    ),
    (
        13_073_957,
        b'data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"model":"/tmp/tiny-moe.gguf",'
        b'"tokens_predicted":3,"tokens_evaluated":4,"has_new_line":false,"truncated":false,"stop_type":"limit",'
        b'"stopping_word":"","tokens_cached":6,"timings":{"cache_n":0,"prompt_n":4,"prompt_ms":1.531,'
        b'"prompt_per_token_ms":0.38275,"prompt_per_second":2612.6714565643374,"predicted_n":3,"predicted_ms":5.735,'
        b'"predicted_per_token_ms":2.8675,"predicted_per_second":348.73583260680033}}\n\n',
    ),
]

# Recorded too: the first token ended inside a UTF-8 character, so the server held it (and the
# next) back and released them with the third (tokens_predicted 3).
HELD_BACK = [
    (
        3_357_994,
        b'data: {"index":0,"content":"\xef\xbf\xbdR<xover_pad_308>","tokens":[565],"stop":false,"id_slot":-1,"tokens_predicted":3,"tokens_evaluated":3}\n\n',
    ),
    (
        3_958_343,
        b'data: {"index":0,"content":"<xover_pad_538>","tokens":[795],"stop":false,"id_slot":-1,"tokens_predicted":4,"tokens_evaluated":3}\n\n',
    ),
    (
        4_600_000,
        b'data: {"index":0,"content":"","tokens":[],"id_slot":0,"stop":true,"tokens_predicted":4,"timings":{"cache_n":0,'
        b'"prompt_n":3,"prompt_ms":2.9,"prompt_per_second":1034.5,"predicted_n":4,"predicted_ms":1.8,"predicted_per_second":2222.2}}\n\n',
    ),
]


def _event(obj: str) -> bytes:
    return b"data: " + obj.encode() + b"\n\n"


def test_recorded_stream_gives_three_clocks_and_server_timings() -> None:
    r = parse_completion_stream(RECORDED, t0_ns=0)
    assert r.error is None
    assert r.first_byte_ns == 4_910_589
    assert r.first_token_ns == 4_910_589
    assert r.token_times_ns == (4_910_589, 5_745_878, 13_047_267)
    assert r.end_ns == 13_073_957
    assert r.first_event_n_decoded == 1
    t = r.timings
    assert t is not None
    assert (t.cache_n, t.prompt_n, t.predicted_n) == (0, 4, 3)
    assert t.prompt_ms == 1.531 and t.predicted_per_second == 348.73583260680033


def test_offsets_are_from_the_send() -> None:
    r = parse_completion_stream([(t + 1_000, c) for t, c in RECORDED], t0_ns=1_000)
    assert r.first_token_ns == 4_910_589


def test_held_back_tokens_take_the_time_of_the_event_that_released_them() -> None:
    r = parse_completion_stream(HELD_BACK, t0_ns=0)
    assert r.error is None
    assert r.first_event_n_decoded == 3
    assert r.token_times_ns == (3_357_994, 3_357_994, 3_357_994, 3_958_343)


def test_an_event_split_over_chunks_is_stamped_with_the_chunk_that_completed_it() -> None:
    raw = RECORDED[0][1]
    chunks = [(10, raw[:7]), (20, raw[7:-1]), (30, raw[-1:])]
    events = parse_sse(chunks).events
    assert [e.t_ns for e in events] == [30]
    assert parse_completion_stream(chunks, 0).first_byte_ns == 10


def test_several_events_in_one_chunk_share_its_time() -> None:
    chunks = [(5, RECORDED[0][1] + RECORDED[1][1]), (9, RECORDED[2][1] + RECORDED[3][1])]
    r = parse_completion_stream(chunks, 0)
    assert r.token_times_ns == (5, 5, 9) and r.end_ns == 9


@given(st.lists(st.integers(min_value=1, max_value=400), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    raw = b"".join(c for _, c in RECORDED)
    points = sorted({min(c, len(raw)) for c in cuts if c < len(raw)})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    chunks = [(i, p) for i, p in enumerate(pieces)]
    whole = parse_sse([(0, raw)]).events
    split = parse_sse(chunks).events
    assert [(e.event, e.data) for e in split] == [(e.event, e.data) for e in whole]
    ends = [i for i, p in enumerate(pieces)]
    assert all(e.t_ns in ends for e in split)
    assert parse_completion_stream(chunks, 0).timings == parse_completion_stream([(0, raw)], 0).timings


def test_sse_field_rules() -> None:
    raw = (
        b": ping\r\n\r\n"  # a comment alone dispatches nothing
        b"event: custom\r\ndata:no-space\r\ndata:  two spaces\r\n\r\n"
        b"id: 7\rdata: cr\r\r"
        b"data\n\n"  # a field with no colon: empty value
        b"retry: 10\n\n"  # no data: not dispatched
        b"data: tail-without-blank-line"
    )
    parsed = parse_sse([(1, raw)])
    assert parsed.events == (
        SseEvent(1, "custom", "no-space\n two spaces"),
        SseEvent(1, "message", "cr"),
        SseEvent(1, "message", ""),
    )
    assert parsed.trailing == b"data: tail-without-blank-line"


def test_keep_alive_ping_is_the_first_byte_not_the_first_token() -> None:
    # llama-server sends ":\n\n" every --sse-ping-interval (30 s) while a long prefill runs: seen as 30.0 s
    # "first bytes" on 4K prompts at 70 t/s (studies/h200-gpt-oss-120b-budgets/g24).
    s = 1_000_000_000
    pinged = [(30 * s, b":\n\n"), *((60 * s + t, c) for t, c in RECORDED)]
    r = parse_completion_stream(pinged, t0_ns=0)
    plain = parse_completion_stream(RECORDED, t0_ns=0)
    assert r.first_byte_ns == 30 * s
    assert r.first_token_ns == 60 * s + RECORDED[0][0]
    assert r.token_times_ns == tuple(60 * s + t for t in plain.token_times_ns)
    assert r.timings == plain.timings and r.error is None


def test_no_chunks() -> None:
    r = parse_completion_stream([], 0)
    assert r.first_byte_ns is None and r.first_token_ns is None and r.timings is None
    assert r.error == "stream ended after 0 tokens without the final event (stop: true)"


def test_malformed_event_keeps_the_tokens_before_it() -> None:
    chunks = [RECORDED[0], (6, b'data: {"content": "x", "tokens": [1\n\n'), RECORDED[3]]
    r = parse_completion_stream(chunks, 0)
    assert r.error is not None and r.error.startswith("malformed event #2 after 1 tokens:")
    assert r.token_times_ns == (4_910_589,)
    assert r.timings is None


def test_non_object_event_is_malformed() -> None:
    r = parse_completion_stream([(1, _event("[1, 2]"))], 0)
    assert r.error is not None and "not a JSON object" in r.error


def test_error_event() -> None:
    err = '{"error": {"code": 500, "message": "context shift is disabled", "type": "server_error"}}'
    r = parse_completion_stream([RECORDED[0], (7, _event(err))], 0)
    assert r.error == "server error after 1 tokens: context shift is disabled"


def test_stream_cut_mid_event_or_between_events() -> None:
    cut = parse_completion_stream([RECORDED[0], (8, RECORDED[1][1][:30])], 0)
    assert cut.error is not None and cut.error.startswith("stream ended mid-event after 1 tokens")
    between = parse_completion_stream(RECORDED[:2], 0)
    assert between.error == "stream ended after 2 tokens without the final event (stop: true)"
    broken = parse_completion_stream(RECORDED[:2], 0, transport_error="RemoteProtocolError: incomplete chunked read")
    assert broken.error == "stream broke after 2 tokens: RemoteProtocolError: incomplete chunked read"
    assert broken.token_times_ns == (4_910_589, 5_745_878)


def test_final_event_without_timings_is_an_error() -> None:
    r = parse_completion_stream([RECORDED[0], (9, _event('{"content": "", "stop": true}'))], 0)
    assert r.error == "final event (stop: true) carried no timings"
    assert r.end_ns == 9


def test_missing_timing_fields_stay_none() -> None:
    r = parse_completion_stream([(3, _event('{"stop": true, "timings": {"cache_n": 0, "prompt_n": 5}}'))], 0)
    assert r.timings is not None
    assert r.timings.prompt_ms is None and r.timings.predicted_per_second is None
    assert r.first_token_ns is None and r.token_times_ns == ()


def test_events_without_token_ids_count_content() -> None:
    chunks = [
        (1, _event('{"content": "a", "stop": false}')),
        (2, _event('{"content": "", "stop": false}')),
        (3, _event('{"content": "b", "stop": false}')),
        (4, _event('{"stop": true, "timings": {}}')),
    ]
    r = parse_completion_stream(chunks, 0)
    assert r.token_times_ns == (1, 3) and r.first_event_n_decoded == 1
