"""The real llama-server loads tiny-moe and answers a completion for a text prompt and a token-id prompt."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from xover.llamacpp import process

pytestmark = pytest.mark.real


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_server_answers_text_and_token_prompts(llama_bins, tiny_model: Path, tmp_path: Path) -> None:
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    proc = process.spawn(
        [
            str(llama_bins.server),
            "-m",
            str(tiny_model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            "2048",
            "-np",
            "1",
            "-t",
            "2",
            "--cache-ram",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        text = _post(f"{base}/completion", {"prompt": "def add(a, b):", "n_predict": 8, "ignore_eos": True})
        n_text = len(_post(f"{base}/tokenize", {"content": "def add(a, b):"})["tokens"])
        assert n_text > 1
        assert text["timings"]["predicted_n"] == 8
        assert text["timings"]["prompt_n"] + text["timings"]["cache_n"] >= n_text  # the text was tokenized, not dropped
        ids = list(range(300, 364))
        tok = _post(f"{base}/completion", {"prompt": ids, "n_predict": 8, "ignore_eos": True, "cache_prompt": False})
        assert tok["timings"]["prompt_n"] == len(ids) and tok["timings"]["cache_n"] == 0
        assert tok["timings"]["predicted_n"] == 8
    finally:
        process.stop(proc)
        log.close()
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
