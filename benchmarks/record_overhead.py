"""What does `xover record` add to the client's TTFT and decode? The same server, direct and through the proxy.

One llama-server (tiny-moe, synthesized on the fly, or -m) and one `xover record` process in front of it. Pairs of
the same cold streamed chat request (``cache_prompt: false``), one direct and one through the proxy, alternating
which goes first, for N pairs. Per request the client's TTFT (send to the first content event) and its decode rate
(content events after the first over their time). Prints the median of the paired differences (proxy - direct) of
TTFT with its interquartile range, and the median decode rates both ways. Target: a median added TTFT under 1 ms
and no change in decode rate (issue 48).

    .venv/bin/python benchmarks/record_overhead.py               # 30 pairs, 512-token prompts, 64-token answers
    .venv/bin/python benchmarks/record_overhead.py -m model.gguf --pairs 50 --length 2048
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from xover.domain.presets import PRESETS
from xover.gguf.synth import write_model
from xover.llamacpp import build, process


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> None:
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} never became healthy")


def _one(client: httpx.Client, url: str, body: dict) -> tuple[float, float]:
    """Client TTFT (s) and decode rate (content events a second after the first) of one streamed request."""
    times, seen = [], []
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            seen.append(line)
            if line.startswith("data: {") and '"delta":{"content"' in line.replace(" ", ""):  # a token's event
                times.append(time.perf_counter())
    if len(times) < 2:
        raise SystemExit(f"{url}: fewer than 2 token events (HTTP {r.status_code}: {' '.join(seen)[:300]!r})")
    return times[0] - t0, (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None, help="a GGUF (default: tiny-moe, synthesized)")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--length", type=int, default=512, help="prompt characters (tiny-moe: about a token each)")
    ap.add_argument("--answer", type=int, default=64, help="answer tokens")
    args = ap.parse_args()
    server_bin = Path(build.build(backend="cpu").bin_dir) / "llama-server"
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or write_model(PRESETS["tiny-moe"], Path(tmp) / "tiny-moe.gguf", seed=0).path
        sp, pp = _port(), _port()
        direct, proxied = f"http://127.0.0.1:{sp}", f"http://127.0.0.1:{pp}"
        argv = [str(server_bin), "-m", str(model), "--port", str(sp), "-c", "8192", "-np", "1", "--cache-ram", "0"]
        server = process.spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proxy = subprocess.Popen(
            [sys.executable, "-m", "xover", "record", "-u", direct, "-o", f"{tmp}/rec.jsonl", "-p", str(pp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _healthy(direct)
            _healthy(proxied)
            body = {
                "messages": [{"role": "user", "content": "x" * args.length}],
                "max_tokens": args.answer,
                "stream": True,
                "cache_prompt": False,
                "ignore_eos": True,
                "temperature": 0,  # greedy: the same answer every time (sampled pad tokens can be held back)
            }
            # a new connection a request on both sides (llama-server closes a kept-alive one after a few requests)
            with httpx.Client(timeout=120, limits=httpx.Limits(max_keepalive_connections=0)) as client:
                for url in (direct, proxied):  # warm-up, discarded
                    _one(client, url, body)
                d_ttft, p_ttft, d_dec, p_dec = [], [], [], []
                for i in range(args.pairs):
                    order = (direct, proxied) if i % 2 == 0 else (proxied, direct)
                    got = {url: _one(client, url, body) for url in order}
                    d_ttft.append(got[direct][0])
                    p_ttft.append(got[proxied][0])
                    d_dec.append(got[direct][1])
                    p_dec.append(got[proxied][1])
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
            process.stop(server)
    diffs = sorted((p - d) * 1e3 for p, d in zip(p_ttft, d_ttft))
    q = statistics.quantiles(diffs, n=4)
    print(f"{args.pairs} pairs, {args.length}-character prompts, {args.answer}-token answers, alternating order")
    print(
        f"TTFT direct median {statistics.median(d_ttft) * 1e3:.2f} ms, through xover record "
        f"{statistics.median(p_ttft) * 1e3:.2f} ms"
    )
    added = statistics.median(diffs)
    print(
        f"added TTFT (paired): median {added:.2f} ms, IQR {q[0]:.2f} to {q[2]:.2f} ms; target under 1 ms: "
        f"{'met' if added < 1 else 'not met'}"
    )
    print(
        f"decode direct median {statistics.median(d_dec):.1f} events/s, through xover record "
        f"{statistics.median(p_dec):.1f} events/s ({statistics.median(p_dec) / statistics.median(d_dec) - 1:+.1%})"
    )


if __name__ == "__main__":
    main()
