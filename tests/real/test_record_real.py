"""`xover record` between a real OpenAI client (the openai SDK) and the real llama-server on tiny-moe (issue 48).

The client streams a 20-turn agentic session (the generator's) through the proxy; the recording reads back as an
xover-session/1 file whose turns are exactly what was sent, whose replies are exactly what the client received, and
whose timings are the server's own (prompt tokens, cache_n) with the client's TTFT and decode beside them. A body
that is not JSON is refused and forwarded nowhere; a proxy killed with SIGKILL leaves every completed turn readable.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from xover.domain.workload import WorkloadSpec, generate, loads
from xover.llamacpp import process

pytestmark = pytest.mark.real

SESSION = WorkloadSpec(seed=2, turns=20, system_tokens=256, target_tokens=29_800, rewrite_every=0, chars_per_token=1.0)
ANSWER = 8
EOS = {"ignore_eos": True}  # a whole answer of ANSWER tokens (llama-server's own request field)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered"
        time.sleep(0.1)


@pytest.fixture
def server(llama_bins, tiny_model: Path, tmp_path: Path) -> Iterator[str]:
    port, log = _free_port(), tmp_path / "server.log"
    argv = [str(llama_bins.server), "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "-c", "65536",
            "-np", "1", "-t", "2", "--cache-ram", "0"]  # fmt: skip
    with log.open("w") as out:
        proc = process.spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/health", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop(proc)


def _proxy(upstream: str, rec: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port, log = _free_port(), tmp_path / f"record-{len(list(tmp_path.glob('record-*')))}.log"
    argv = [sys.executable, "-m", "xover", "record", "--upstream", upstream, "-o", str(rec), "-p", str(port), *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    _wait(f"http://127.0.0.1:{port}/health", proc, log)
    return proc, f"http://127.0.0.1:{port}"


def test_a_real_client_streams_a_session_through_the_proxy_and_it_is_recorded(server: str, tmp_path: Path) -> None:
    from openai import OpenAI

    rec = tmp_path / "rec.jsonl"
    proc, url = _proxy(server, rec, tmp_path)
    session = generate(SESSION)
    received = []
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        models = client.models.list()
        assert models.data  # GET /v1/models passes through
        for turn in session.turns:
            stream = client.chat.completions.create(
                model="tiny",
                messages=list(turn.messages),
                max_tokens=ANSWER,
                stream=True,
                extra_body=EOS,  # type: ignore[arg-type]
            )
            received.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert os.stat(rec).st_mode & 0o777 == 0o600
    recorded = loads(rec.read_text(encoding="utf-8"), "rec.jsonl")
    assert len(recorded.turns) == 20 and recorded.header is not None and recorded.header["format"] == "xover-session/1"
    assert [list(t.messages) for t in recorded.turns] == [list(t.messages) for t in session.turns]
    assert [t.assistant for t in recorded.turns] == received
    seen = [json.loads(line)["recorded"] for line in rec.read_text().splitlines() if '"turn":' in line]
    for s in seen:
        assert s["error"] is None and s["stream"] and s["status"] == 200
        assert s["prompt_tokens"] > 0 and s["answer_tokens"] == ANSWER and s["ttft_s"] > 0 and s["decode_tps"] > 0
        assert s["server_prompt_tps"] > 0 and s["server_decode_tps"] > 0
    assert seen[0]["since_previous_s"] is None and all(s["since_previous_s"] > 0 for s in seen[1:])
    # the server's cache served the resent conversation: cache_n on most later turns
    assert seen[0]["cached_tokens"] == 0 and sum(s["cached_tokens"] > 0 for s in seen[1:]) >= 10
    # the prompt grows as the agent resends it
    assert seen[-1]["prompt_tokens"] > seen[0]["prompt_tokens"]


def test_bad_requests_are_refused_and_forwarded_nowhere(server: str, tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    proc, url = _proxy(server, rec, tmp_path, "--max-body", "4096")
    try:
        with httpx.Client(timeout=30) as c:
            r = c.post(f"{url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
            assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
            r = c.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 8000}]})
            assert r.status_code == 413 and "forwarded nowhere" in r.json()["error"]["message"]
            ok = c.post(f"{url}/completion", json={"prompt": "hello", "n_predict": 4})
            assert ok.status_code == 200 and ok.json()["tokens_predicted"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    # the header, then the one forwarded request; the refused ones left no trace upstream
    assert [x.get("event") for x in lines[1:]] == ["request"]
    assert lines[1]["recorded"]["path"] == "/completion" and lines[1]["recorded"]["answer_tokens"] == 4


def test_a_killed_proxy_leaves_every_completed_turn_readable(server: str, tmp_path: Path) -> None:
    from openai import OpenAI

    rec = tmp_path / "rec.jsonl"
    proc, url = _proxy(server, rec, tmp_path)
    session = generate(SESSION)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        # the kill comes the moment the last answer is in the client's hands: non-streamed answers, then a stream
        # read up to its [DONE] (the OpenAI client stops reading there)
        for i, turn in enumerate(session.turns[:4]):
            if i < 3:
                client.chat.completions.create(
                    model="tiny", messages=list(turn.messages), max_tokens=ANSWER, extra_body=EOS
                )  # type: ignore[arg-type]
            else:
                for _ in client.chat.completions.create(
                    model="tiny", messages=list(turn.messages), max_tokens=ANSWER, extra_body=EOS, stream=True
                ):  # type: ignore[arg-type]
                    pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    recorded = loads(rec.read_text(encoding="utf-8"), "rec.jsonl")
    assert len(recorded.turns) == 4 and all(t.assistant for t in recorded.turns)


def _slot_busy(server: str) -> bool:
    slots = httpx.get(f"{server}/slots", timeout=10).json()
    return any(s.get("is_processing") for s in slots)


def _released_at(log: Path) -> list[int]:
    """The slot's context (prompt and answer tokens) at each request's end, as llama-server logs it at its default
    verbosity (``slot release: ... stop processing: n_tokens = K``, :mod:`xover.domain.server_log`)."""
    return [int(n) for n in re.findall(r"stop processing: n_tokens = (\d+)", log.read_text(errors="replace"))]


def test_a_client_that_leaves_stops_the_upstream_request(server: str, tmp_path: Path) -> None:
    """The client reads a few chunks of a long answer and closes: the proxy closes its upstream request, and the
    server's slot is released long before the answer's 20,000 tokens. The server's own count at the release says so
    (how long that took is the machine's: a fast one could even finish all 20,000 tokens within a deadline)."""
    rec = tmp_path / "rec.jsonl"
    proc, url = _proxy(server, rec, tmp_path)
    body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 20_000, "stream": True, **EOS}
    try:
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            got = b""
            for chunk in r.iter_bytes():
                got += chunk
                if got.count(b"data: ") >= 5:
                    assert r.status_code == 200 and _slot_busy(server)  # still generating for the client
                    break  # the generator closes the response: the client has left
        deadline = time.monotonic() + 120  # no hang; the tokens the answer reached, below, carry the claim
        while _slot_busy(server) or not _released_at(tmp_path / "server.log"):  # (the log is written by a thread)
            assert time.monotonic() < deadline, "the upstream kept generating for a client that left"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    (released,) = _released_at(tmp_path / "server.log")  # the one request, released when the proxy closed it
    assert released < 20_000, f"the upstream generated the whole answer for a client that left ({released} tokens)"
    lines = [json.loads(x) for x in rec.read_text().splitlines()[1:]]
    assert [x.get("event") for x in lines] == ["request"] and "client disconnected" in lines[0]["recorded"]["error"]


def test_an_upstream_that_dies_mid_stream_is_an_error_to_the_client(
    llama_bins, tiny_model: Path, tmp_path: Path
) -> None:
    """The server is killed while it streams: the client's SDK gets an error (an OpenAI-style error event), the
    proxy goes on, and the recording keeps the completed turn before it, with the broken one as an event."""
    from openai import APIError, OpenAI

    port, log = _free_port(), tmp_path / "server.log"
    argv = [str(llama_bins.server), "-m", str(tiny_model), "--host", "127.0.0.1", "--port", str(port), "-c", "32768",
            "-np", "1", "-t", "2", "--cache-ram", "0"]  # fmt: skip
    with log.open("w") as out:
        server = process.spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    upstream = f"http://127.0.0.1:{port}"
    rec = tmp_path / "rec.jsonl"
    try:
        _wait(f"{upstream}/health", server, log)
        proc, url = _proxy(upstream, rec, tmp_path)
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "hello"}]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=ANSWER, extra_body=EOS)  # type: ignore[arg-type]
        stream = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=20_000,
            stream=True,
            extra_body=EOS,  # type: ignore[arg-type]
        )
        with pytest.raises(APIError):
            for n, _ in enumerate(stream):
                if n == 5:
                    server.send_signal(signal.SIGKILL)
        assert proc.poll() is None  # the proxy goes on
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        process.stop(server)
    recorded = loads(rec.read_text(encoding="utf-8"), "rec.jsonl")
    assert len(recorded.turns) == 1
    (broken,) = [json.loads(x) for x in rec.read_text().splitlines() if '"event":' in x]
    assert "upstream broke" in broken["recorded"]["error"]


def test_shape_only_keeps_no_text_and_replays_the_same_token_counts(server: str, tmp_path: Path) -> None:
    """The client's session goes through two proxies in a chain, a full recording in front of a shape-only one, so
    both record the same traffic. The shape-only file holds none of the session's text, only token lengths and
    keyed hashes; realized as synthetic text on the same server, every turn's prompt is within 1% of the tokens the
    server counted for the real text, and the blocks the conversation resends are the same text again (a shared
    prefix the server's cache serves)."""
    import asyncio

    from openai import OpenAI

    from xover.client.chat import ChatClient
    from xover.domain.turn_shape import is_shape_only, loads_shapes, realize
    from xover.measure.session import text_of_tokens

    full, shape, key = tmp_path / "full.jsonl", tmp_path / "shape.jsonl", tmp_path / "k.key"
    inner, inner_url = _proxy(server, shape, tmp_path, "--shape-only", "--key-file", str(key))
    outer, url = _proxy(inner_url, full, tmp_path)
    session = generate(SESSION)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        for turn in session.turns:
            stream = client.chat.completions.create(
                model="tiny", messages=list(turn.messages), max_tokens=ANSWER, stream=True, extra_body=EOS
            )  # type: ignore[arg-type]
            for _ in stream:
                pass
    finally:
        for p in (outer, inner):
            p.send_signal(signal.SIGINT)
            assert p.wait(timeout=30) == 0
    assert os.stat(shape).st_mode & 0o777 == 0o600 and os.stat(key).st_mode & 0o777 == 0o600
    text = shape.read_text(encoding="utf-8")
    assert is_shape_only(text) and not is_shape_only(full.read_text(encoding="utf-8"))
    words = {w for t in session.turns for m in t.messages for w in str(m["content"]).split() if len(w) >= 12}
    assert len(words) > 50 and not [w for w in words if w in text]  # no text of the session is in the file
    assert key.read_bytes() not in text.encode() and key.read_bytes().hex() not in text
    shapes = loads_shapes(text, "shape.jsonl")
    counted = [json.loads(x)["recorded"]["prompt_tokens"] for x in full.read_text().splitlines() if '"turn":' in x]
    assert len(shapes.turns) == len(counted) == 20

    async def replayed() -> list[int]:
        async with ChatClient(server) as c:
            texts = {b: await text_of_tokens(c, b) for b in shapes.blocks()}
            real = realize(shapes, texts.__getitem__)
            return [len(await c.prompt_tokens(t.messages)) for t in real.turns]

    tokens = asyncio.run(replayed())
    for n, (got, want) in enumerate(zip(tokens, counted, strict=True)):
        assert abs(got - want) <= 0.01 * want, (n, got, want)
    # the resent conversation is a shared prefix again: turn 1's messages open with turn 0's, block for block
    assert shapes.turns[1].messages[: len(shapes.turns[0].messages)] == shapes.turns[0].messages


def test_a_study_of_the_recorded_turns_answers_in_minutes(server: str, llama_bins, tmp_path: Path) -> None:
    """A short session recorded through the proxy, then `xover study --workload`: the recording decides the lengths
    and cached turns measured, the replay runs on both configurations, and the verdict is in the user's waiting
    over the recorded turns, with the replay's measured waiting against the prediction in the report."""
    from openai import OpenAI

    from xover.results.read_model import load

    rec = tmp_path / "rec.jsonl"
    proc, url = _proxy(server, rec, tmp_path)
    small = WorkloadSpec(seed=6, turns=5, system_tokens=256, target_tokens=2_500, rewrite_every=0, chars_per_token=1.0)
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        for turn in generate(small).turns:
            for _ in client.chat.completions.create(
                model="tiny", messages=list(turn.messages), max_tokens=ANSWER, stream=True, extra_body=EOS
            ):  # type: ignore[arg-type]
                pass
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    spec = Path(__file__).parent.parent.parent / "examples" / "your-turns.toml"
    out = tmp_path / "study"
    r = subprocess.run([sys.executable, "-m", "xover", "study", str(spec), "--workload", str(rec), "-o", str(out),
                        "--llama-bin-dir", str(llama_bins.server.parent), "-q"],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, said[-3000:]
    assert "Your 5 recorded turns (rec.jsonl): waiting over all of them" in said
    assert "Over your 5 recorded turns, ub" in said  # the pair, in the user's time
    data = load(out)
    w = data.workload()
    assert w is not None and w.kind == "full" and len(w.turns) == 5 and w.turns[0][1] == 0
    # the study measured what the turns need: cold lengths up to the longest context, answers of ANSWER tokens
    longest = max(p for p, _, _ in w.turns)
    lengths = sorted({s.length for _, s in data.cold_samples()})
    assert len(lengths) == 3 and lengths[-1] >= longest and lengths[-1] - longest < 256
    assert {s.length for samples in data.cached_samples().values() for _, s in samples}  # cached turns measured
    # the replay: the recording itself, once per configuration at the server's default cache
    assert sorted((s.label, s.mode, len(s.turns)) for s in data.session) == [("ub512", "default", 5),
                                                                              ("ub64", "default", 5)]  # fmt: skip
    report = (out / "report.md").read_text()
    assert "## Your recorded turns" in report and "The replay against the prediction" in report
    assert "new tokens a turn" in report and "Waiting over your turns, per configuration" in report
