"""`xover record --from-log` on logs the real servers write here (issue 48 item 3): the pinned llama.cpp's and
ik_llama.cpp's CPU servers, at their default verbosity, serve six turns of a generated agentic session; the log
imported gives every turn's prompt and cached prefix exactly as each response's own numbers said them."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from xover.client.chat import ChatClient, chat_body
from xover.domain.turn_shape import loads_shapes
from xover.domain.workload import WorkloadSpec, generate
from xover.llamacpp import process

pytestmark = pytest.mark.real

SESSION = WorkloadSpec(seed=4, turns=6, system_tokens=256, target_tokens=6_000, rewrite_every=3, chars_per_token=1.0)


def _serve_and_ask(server: Path, model: Path, log: Path, port: int) -> list[tuple[int | None, int | None]]:
    argv = [
        str(server),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "16384",
        "-np",
        "1",
        "-t",
        "2",
    ]  # fmt: skip  (the user's server: its prompt cache on, as they run it)
    with log.open("w") as out:
        proc = process.spawn(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        return asyncio.run(_ask(f"http://127.0.0.1:{port}", proc, log))
    finally:
        process.stop(proc)


async def _ask(url: str, proc: subprocess.Popen[bytes], log: Path) -> list[tuple[int | None, int | None]]:
    async with ChatClient(url) as c:
        for _ in range(600):
            assert proc.poll() is None, log.read_text()[-2000:]
            if (await c.health())[0] == 200:
                break
            await asyncio.sleep(0.1)
        seen = []
        for t in generate(SESSION).turns:
            body = chat_body(list(t.messages), 8, cache_prompt=True) | {"ignore_eos": True}
            rec = await c.stream_chat(body)
            assert rec.result.error is None, rec.result.error
            seen.append((rec.result.prompt_tokens, rec.result.cached_tokens))
        return seen


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_a_real_servers_log_imports_as_its_turns(engine: str, request: pytest.FixtureRequest, tiny_model: Path,
                                                  tmp_path: Path) -> None:  # fmt: skip
    bins = request.getfixturevalue("llama_bins" if engine == "llama.cpp" else "ik_bins")
    log, out = tmp_path / "server.log", tmp_path / "turns.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    seen = _serve_and_ask(bins.server, tiny_model, log, port)
    r = subprocess.run([sys.executable, "-m", "xover", "record", "--from-log", str(log), "-o", str(out)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0 and f"6 requests from {log} ({engine}'s log), shape-only" in said, said
    assert os.stat(out).st_mode & 0o777 == 0o600
    recorded = [t.recorded for t in loads_shapes(out.read_text(), "turns.jsonl").turns]
    assert all(x is not None for x in recorded)
    got = [(x["prompt_tokens"], x["cached_tokens"]) for x in recorded if x is not None]
    assert [p for p, _ in got] == [p for p, _ in seen]  # the prompts as each response counted them
    cached = [c for _, c in seen]
    if all(c is not None for c in cached):  # where the response says its cached prefix, the log says the same
        assert [c for _, c in got] == cached
    # the agent resends the conversation: later turns take a prefix from the cache, and the rewrite turn (3) less
    assert got[0][1] == 0 and all(c > 0 for _, c in got[1:])
    assert json.loads(out.read_text().splitlines()[0])["recorder"]["engine"] == engine


def test_a_log_replays_as_synthetic_turns_with_the_same_tokens_and_cache_hits(llama_bins, tiny_model: Path,
                                                                              tmp_path: Path) -> None:  # fmt: skip
    """The imported log replayed by `xover session --workload` on the real server: each turn is synthetic text made
    on the server's own tokenizer, its prompt within 1% of the tokens the log counted (the chat template's few tokens
    on top), and the resent prefix is served from the slot's cache as it was in the logged session."""
    from xover.results.read_model import load

    log, turns, out = tmp_path / "server.log", tmp_path / "turns.jsonl", tmp_path / "replay"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _serve_and_ask(llama_bins.server, tiny_model, log, port)
    subprocess.run([sys.executable, "-m", "xover", "record", "--from-log", str(log), "-o", str(turns)], check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "xover", "session", "-m", str(tiny_model), "--workload", str(turns),
                        "--exact", "--cache-modes", "default", "-R", "8", "-o", str(out),
                        "--llama-bin-dir", str(llama_bins.server.parent)],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, said[-3000:]
    assert "is shape-only: replayed as synthetic text" in said
    logged = [t.recorded for t in loads_shapes(turns.read_text(), "turns.jsonl").turns]
    (series,) = load(out).session
    replayed = [(t.prompt_tokens, t.cached_tokens) for t in series.turns]
    assert len(replayed) == len(logged) == SESSION.turns
    for (prompt, cached), want in zip(replayed, logged, strict=True):
        assert want is not None and prompt is not None and abs(prompt - want["prompt_tokens"]) <= 0.01 * prompt
        if want["cached_tokens"]:  # a hit in the logged session is a hit in the replay
            assert cached and cached >= 0.95 * want["cached_tokens"]
