"""The client, server lifecycle and TTFT runner against fakes: faults, known answers, no orphans.

The fakes (tests/fakes/llama_server.py) run on 127.0.0.1 and stop by themselves. Lifecycle tests
start the fake as a stand-in ``llama-server`` binary through the real :class:`LlamaServer`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from fakes.llama_server import FakeLlamaServer
from xover.analysis.stats import summarize
from xover.cli import main
from xover.client.http import LlamaClient, RequestError, completion_body
from xover.domain.records import ServerTimings, TtftSample
from xover.errors import XoverError
from xover.measure.events import Rerun, TtftEvent
from xover.measure.ttft import (
    PointSummary,
    RunOutcome,
    TtftPlan,
    TtftPoint,
    TtftRun,
    check_cache,
    expand,
    gap_note,
    sample_metrics,
    summarize_points,
)
from xover.results.store import Store

PLAN = TtftPlan(lengths=(32, 64), reps=3, response_tokens=8, seed=11)


def run_url(
    study: Path, url: str, plan: TtftPlan = PLAN, timeout_s: float = 10.0, events: list[TtftEvent] | None = None
) -> RunOutcome:
    with Store(study) as store:
        run = TtftRun(store, plan, ["test"], on_event=(events.append if events is not None else lambda ev: None))
        return asyncio.run(run.run_url(url, startup_timeout_s=timeout_s))


def stored(study: Path) -> list[TtftSample]:
    with Store(study) as store:
        return [s for _, _, _, s in store.ttft_samples()]


# ---- pure: plan, checks, metrics, summaries -----------------------------------------------------


def test_plan_is_rep_major() -> None:
    pts = expand(TtftPlan(lengths=(64, 256), reps=2, response_tokens=4))
    assert [(p.rep, p.length) for p in pts] == [(0, 64), (0, 256), (1, 256), (1, 64)]  # no length always first


def test_plan_with_explicit_points() -> None:
    pts = (TtftPoint(256, 2), TtftPoint(64, 1))
    assert expand(TtftPlan(lengths=(64, 256), reps=3, response_tokens=4, points=pts)) == pts
    with pytest.raises(XoverError, match="one of the plan's lengths"):
        TtftPlan(lengths=(64,), reps=1, response_tokens=4, points=(TtftPoint(128, 0),))


def test_plan_validation() -> None:
    with pytest.raises(XoverError):
        TtftPlan(lengths=(64,), reps=1, response_tokens=4, mode="hot")
    with pytest.raises(XoverError, match="warm mode"):
        TtftPlan(lengths=(1,), reps=1, response_tokens=4, mode="warm")


def _t(cache_n: int | None, prompt_n: int | None) -> ServerTimings:
    return ServerTimings(cache_n, prompt_n, 10.0, 1000.0, 8, 16.0, 500.0)


def test_check_cache() -> None:
    assert check_cache("cold", 64, _t(0, 64)) is None
    assert (
        check_cache("cold", 64, _t(32, 32))
        == "cold check failed: cache_n=32 prompt_n=32, expected cache_n=0 prompt_n=64"
    )
    assert check_cache("cold", 64, _t(0, 65)) is not None  # a BOS the plan did not count is caught too
    assert check_cache("warm", 64, _t(63, 1)) is None
    assert check_cache("warm", 64, _t(0, 64)) is not None
    assert check_cache("cold", 64, None) == "no cache_n/prompt_n in the server's timings"
    assert check_cache("cold", 64, _t(None, 64)) is not None
    # a cached turn served from an SWA model's context checkpoint at the depth processes its last token again (seen
    # on gpt-oss-20b at -ub 512: cache_n 16383, prompt_n 2049 for a 2048-token turn on a 16K context)
    assert check_cache("cached:16384", 2048, _t(16384, 2048)) is None
    assert check_cache("cached:16384", 2048, _t(16383, 2049)) is None
    assert check_cache("cached:16384", 2048, _t(16383, 2048)) is not None  # the counts must add up
    assert check_cache("cached:16384", 2048, _t(14336, 4096)) is not None  # an earlier checkpoint: not cached
    assert check_cache("cold", 64, _t(1, 65)) is not None and check_cache("warm", 64, _t(62, 2)) is not None


def _sample(
    ttft_ms: float,
    prompt_ms: float,
    *,
    rep: int = 0,
    ok: bool = True,
    length: int = 1000,
    times: tuple[int, ...] | None = None,
    error: str | None = None,
) -> TtftSample:
    t0 = int(ttft_ms * 1e6)
    return TtftSample(
        config_key="k",
        mode="cold",
        length=length,
        rep=rep,
        prompt_id="p",
        sent_at_unix_ns=0,
        first_byte_ns=t0,
        first_token_ns=t0,
        end_ns=t0 + 30_000_000,
        token_times_ns=times if times is not None else (t0, t0 + 10_000_000, t0 + 20_000_000),
        n_tokens_received=3,
        timings=ServerTimings(0, length, prompt_ms, length / prompt_ms * 1e3, 3, 20.0, 150.0),
        cache_ok=ok,
        error=error,
    )


def test_sample_metrics_known_answers() -> None:
    m = sample_metrics(_sample(100.0, 98.0))
    assert m.ttft_ns == 100_000_000
    assert m.gap_ns == 2_000_000
    assert m.prefill_tps_client == pytest.approx(10_000.0)
    assert m.prefill_tps_server == pytest.approx(1000 / 0.098)
    assert m.decode_tps_client == pytest.approx(100.0)  # 2 tokens after the first in 20 ms
    assert m.decode_tps_server == 150.0
    assert not m.first_two_together
    assert sample_metrics(_sample(100.0, 98.0, times=(5, 5, 9))).first_two_together


def test_missing_stays_none() -> None:
    s = _sample(100.0, 98.0)
    bare = TtftSample(**{**s.__dict__, "first_token_ns": None, "token_times_ns": (), "timings": None})
    m = sample_metrics(bare)
    assert (m.ttft_ns, m.gap_ns, m.prefill_tps_client, m.decode_tps_client, m.decode_tps_server) == (None,) * 5


def test_summaries_average_only_checked_samples_and_count_everything() -> None:
    samples = [
        _sample(100.0, 99.0, rep=0),
        _sample(5.0, 4.0, rep=1, ok=False),  # a cache hit in disguise: stored, never averaged
        _sample(110.0, 109.0, rep=1),  # its re-run
        _sample(120.0, 119.0, rep=2),
        _sample(1.0, 1.0, rep=3, ok=False, error="stream broke after 0 tokens"),
    ]
    (p,) = summarize_points(samples)
    assert (p.n_samples, p.n_ok, p.n_reps, p.n_reruns, p.n_errors) == (5, 3, 4, 1, 1)
    assert p.ttft_ns is not None and p.ttft_ns.median == 110_000_000
    assert p.gap_ns is not None and p.gap_ns.median == pytest.approx(1_000_000)
    assert not p.gap_is_large


def _point(ttft_ms: float, gap_ms: float) -> PointSummary:
    return PointSummary(
        config_key="k",
        mode="cold",
        length=4096,
        n_samples=3,
        n_ok=3,
        n_reps=3,
        n_reruns=0,
        n_errors=0,
        n_first_two_together=0,
        ttft_ns=summarize([ttft_ms * 1e6]),
        prefill_tps_client=None,
        prefill_tps_server=None,
        decode_tps_client=None,
        decode_tps_server=None,
        gap_ns=summarize([gap_ms * 1e6]),
    )


def test_gap_note_names_the_likely_cause() -> None:
    assert gap_note(_point(1000.0, 3.0), "ncmoe=12", cold_cache=True) is None  # < 5 ms and < 5 %
    assert gap_note(_point(20.0, 1.5), "ncmoe=12", cold_cache=True) is not None  # > 5 % of a short TTFT
    assert gap_note(_point(20.0, 0.5), "ncmoe=12", cold_cache=True) is None  # under 1 ms is never flagged
    leak = gap_note(_point(30_000.0, 1100.0), "ncmoe=12", cold_cache=False)
    assert leak is not None and "1100.0 ms" in leak and "--cache-ram" in leak and "-np 1 --cache-ram 0" in leak
    url = gap_note(_point(30_000.0, 1100.0), "http://x", cold_cache=None)
    assert url is not None and "--cache-ram" in url
    cold = gap_note(_point(30_000.0, 40.0), "ncmoe=12", cold_cache=True)
    assert cold is not None and "one slot and no prompt cache" in cold


# ---- client on an injected transport --------------------------------------------------------------


def test_mock_transport_keeps_stream_timing_and_sends_the_key_only_as_bearer() -> None:
    seen: list[httpx.Request] = []

    async def body() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.05)
        yield b'data: {"content": "a", "tokens": [1], "stop": false, "tokens_predicted": 1}\n\n'
        await asyncio.sleep(0.02)
        yield b'data: {"stop": true, "timings": {"cache_n": 0, "prompt_n": 4, "prompt_ms": 49.0}}\n\n'

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(200, stream=_Stream(body()))

    async def go() -> object:
        async with LlamaClient("http://fake:1", api_key="sekret", transport=httpx.MockTransport(handler)) as c:
            return await c.stream_completion(completion_body((1, 2, 3, 4), 1, cache_prompt=False))

    rec = asyncio.run(go())
    r = rec.result  # type: ignore[attr-defined]
    assert r.error is None
    assert 45_000_000 <= r.first_token_ns < 1_000_000_000
    assert r.end_ns - r.first_token_ns >= 15_000_000
    assert all(req.headers["authorization"] == "Bearer sekret" for req in seen)
    sent = json.loads(seen[-1].content)
    assert sent == {"prompt": [1, 2, 3, 4], "n_predict": 1, "stream": True, "ignore_eos": True, "cache_prompt": False}


class _Stream(httpx.AsyncByteStream):
    def __init__(self, gen: AsyncIterator[bytes]) -> None:
        self.gen = gen

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.gen:
            yield chunk


def test_unreachable_server_is_a_stored_error_not_a_crash() -> None:
    async def go() -> object:
        async with LlamaClient("http://127.0.0.1:9") as c:
            return await c.stream_completion(completion_body((1,), 1, cache_prompt=False))

    rec = asyncio.run(go())
    assert rec.status is None and rec.result.error.startswith("no connection: ConnectError")  # type: ignore[attr-defined]


def test_requests_after_a_stream_survive_the_silently_closed_connection() -> None:
    """The server closes the connection after each stream, unannounced; the next request must not fail."""

    async def go() -> list[str | None]:
        async with LlamaClient(fake.url) as c:
            errors = []
            for i in range(30):
                rec = await c.stream_completion(completion_body((i + 1, 2, 3), 2, cache_prompt=False))
                errors.append(rec.result.error)
                assert await c.tokenize("ab") == [97, 98]
            return errors

    with FakeLlamaServer(decode_tps=50_000) as fake:
        assert asyncio.run(go()) == [None] * 30


def test_request_error_is_one_line() -> None:
    async def go() -> None:
        async with LlamaClient("http://127.0.0.1:9") as c:
            await c.get_json("/props")

    with pytest.raises(RequestError) as e:
        asyncio.run(go())
    assert "\n" not in str(e.value) and str(e.value).startswith("GET /props at http://127.0.0.1:9: ConnectError")


# ---- faults: each one line, nothing measured before it lost -----------------------------------------


def test_never_healthy_times_out_with_a_clear_error(tmp_path: Path) -> None:
    with FakeLlamaServer(fault="never-healthy") as fake:
        t = time.monotonic()
        out = run_url(tmp_path, fake.url, timeout_s=0.5)
        assert time.monotonic() - t < 10.0  # the 0.5 s given, not run_url's default of 10 s
    (f,) = out.failures
    assert f.stage == "server-start" and "\n" not in f.reason
    assert f"{fake.url} did not become healthy within 0.5 s (last /health: HTTP 503 Loading model)" in f.reason
    assert out.samples == ()


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("cut", "L=64 rep 2: stream broke after 4 tokens: RemoteProtocolError"),
        ("http500", "L=64 rep 2: HTTP 500: fake internal error"),
        ("malformed", "L=64 rep 2: malformed event #5 after 4 tokens: "),
    ],
)
def test_fault_mid_run_keeps_every_earlier_sample(tmp_path: Path, fault: str, message: str) -> None:
    # two warm-ups (a ubatch, then the shortest length) + 2 good samples, then the fault on the third sample: the
    # second repetition's first length, 64 (each repetition begins one length further on)
    with FakeLlamaServer(fault=fault, fault_after=4) as fake:
        out = run_url(tmp_path, fake.url)
    (f,) = out.failures
    assert message in f.reason and "\n" not in f.reason
    rows = stored(tmp_path)
    assert [(s.length, s.rep, s.cache_ok, s.error is None) for s in rows] == [
        (32, 0, True, True),
        (64, 0, True, True),
        (64, 1, False, False),
    ]
    assert rows[2].error is not None and rows[2].error in f.reason
    with Store(tmp_path) as store:
        assert store.runs()[-1]["status"] == "failed"
        assert [x.reason for _, x in store.failures()] == [f.reason]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("http500", "HTTP 500: fake internal error"),
        ("malformed", 'malformed event #3 after 2 tokens: \'{"content": "x", "tokens": [1\''),  # markup-like text
    ],
)
def test_fault_reaches_the_cli_as_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, message: str
) -> None:
    # two warm-ups and one good sample, then the fault
    with FakeLlamaServer(fault=fault, fault_after=3) as fake, pytest.raises(SystemExit) as e:
        main(
            ["ttft", "--url", fake.url, "--lengths", "32,64", "-r", "2", "--response-tokens", "4", "-o", str(tmp_path)]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"xover: error: 1 configuration(s) failed, first: L=64 rep 1: {message}"
    assert len(stored(tmp_path)) == 2


def test_cache_check_failure_is_stored_rerun_and_counted(tmp_path: Path) -> None:
    events: list[TtftEvent] = []
    plan = TtftPlan(lengths=(64,), reps=2, response_tokens=4, seed=1)
    with FakeLlamaServer(fault="cache-leak", fault_after=2, fault_count=1) as fake:
        out = run_url(tmp_path, fake.url, plan, events=events)
    assert out.failures == ()
    assert [(s.rep, s.cache_ok) for s in stored(tmp_path)] == [(0, True), (1, False), (1, True)]
    assert [e.reason for e in events if isinstance(e, Rerun)] == [
        "cold check failed: cache_n=32 prompt_n=32, expected cache_n=0 prompt_n=64"
    ]
    (p,) = summarize_points(out.samples)
    assert (p.n_ok, p.n_samples, p.n_reruns) == (2, 3, 1)
    assert len({s.prompt_id for s in out.samples}) == 3  # every attempt had its own prompt


def test_retries_are_bounded(tmp_path: Path) -> None:
    plan = TtftPlan(lengths=(64,), reps=1, response_tokens=4, seed=1, max_retries=2)
    with FakeLlamaServer(fault="cache-leak", fault_after=1) as fake:
        out = run_url(tmp_path, fake.url, plan)
    (p,) = summarize_points(out.samples)
    assert (p.n_ok, p.n_samples, p.ttft_ns) == (0, 3, None)


def test_default_cache_settings_leak_a_warm_prompt_into_a_cold_sample(tmp_path: Path) -> None:
    """A naive client (cache_prompt true) on a server with several slots and a prompt cache: A, B, A."""
    a, b = tuple(range(10, 74)), tuple(range(100, 164))

    async def go() -> list[str | None]:
        async with LlamaClient(fake.url) as c:
            out = []
            for prompt in (a, b, a):
                rec = await c.stream_completion(completion_body(prompt, 4, cache_prompt=True))
                out.append(check_cache("cold", 64, rec.result.timings))
            return out

    with FakeLlamaServer(n_slots=4, cache_ram=True) as fake:
        checks = asyncio.run(go())
    assert checks[:2] == [None, None]
    assert checks[2] == "cold check failed: cache_n=63 prompt_n=1, expected cache_n=0 prompt_n=64"


# ---- lifecycle with the fake binary -----------------------------------------------------------------


def test_cli_url_mode_prints_the_table_and_keeps_the_api_key_out_of_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XOVER_API_KEY", "sekret-key-123")
    with FakeLlamaServer() as fake:
        main_ok(
            ["ttft", "--url", fake.url, "--lengths", "32,1k", "-r", "2", "--response-tokens", "4", "-o", str(tmp_path)]
        )
    out = capsys.readouterr().out
    assert "time to first token" in out and "1,024" in out and "2/2" in out
    assert b"sekret-key-123" not in (tmp_path / "results.sqlite").read_bytes()
    assert all(b"sekret" not in p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


def test_cli_rejects_server_flags_with_url(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["ttft", "--url", "http://127.0.0.1:9", "--ncmoe", "12", "-o", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "xover: error: --ncmoe does not apply with --url: that server's flags are already set; drop it"
    )


def main_ok(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None), e.code


def test_max_ttft_skips_what_a_slow_configuration_would_take_too_long_for(tmp_path: Path) -> None:
    """A fake server at 2,000 prefill t/s (known answers): with max-ttft 1 s, 256 and 1,024 tokens are measured
    (about 0.13 s and 0.51 s), 4,096 is skipped (about 2 s by the 1,024-token sample) and listed, not failed."""
    from xover.domain.artifacts import SkippedPoint
    from xover.measure.ttft import linear_estimate

    assert linear_estimate(4096, {1024: 0.5, 256: 0.2}) == (2.0, 1024)
    assert linear_estimate(256, {1024: 0.5}) is None
    plan = TtftPlan(lengths=(256, 1024, 4096), reps=1, response_tokens=4, seed=3, max_ttft_s=1.0)
    events: list[TtftEvent] = []
    with FakeLlamaServer(prefill_tps=2_000.0, decode_tps=50_000) as fake:
        out = run_url(tmp_path, fake.url, plan=plan, events=events)
    assert not out.failures
    assert sorted(s.length for s in stored(tmp_path)) == [256, 1024]
    (skip,) = [e for e in events if isinstance(e, SkippedPoint)]
    assert (skip.length, skip.from_length, skip.max_ttft_s) == (4096, 1024, 1.0) and skip.estimate_s > 1.0
    with Store(tmp_path) as store:
        (art,) = [body for _, name, body in store.artifacts("ttft-skipped")]
    assert art["length"] == 4096 and art["from_length"] == 1024
