"""What does `xover record` add to the client's TTFT and decode? The same server, direct and through the proxy.

One llama-server (tiny-moe, synthesized on the fly, or -m) and one `xover record` process in front of it. Pairs of
the same cold streamed chat request (``cache_prompt: false``), one direct and one through the proxy, alternating
which goes first, for N pairs. Per request the client's TTFT (send to the first content event), the part of it
outside the server's own prefill (TTFT less the ``prompt_ms`` of the answer's timings: what the HTTP path costs,
free of the prefill's own noise), and its decode rate (content events after the first over their time). Prints the
median of the paired differences (proxy - direct) of both TTFT measures with their interquartile ranges, and the
median decode rates both ways. Target: a median added TTFT under 1 ms and no change in decode rate (issue 48).

The server gets one thread fewer than the machine has cores (``-t``, at least 1), so that the client and the proxy
have a core of their own as they do beside a server whose decode runs on a GPU; ``--threads`` sets it.

    .venv/bin/python benchmarks/record_overhead.py               # 30 pairs, 512-token prompts, 64-token answers
    .venv/bin/python benchmarks/record_overhead.py --wide --pairs 40   # a real model's decode rate (~430 t/s here)
    .venv/bin/python benchmarks/record_overhead.py -m model.gguf --pairs 50 --length 2048

Measured on 2 cores (2026-12-05), server ``-t 1``; the added TTFT outside the server's prefill (the target's
measure: the whole TTFT's paired difference carries the prefill's own noise, IQR +-4 ms on --wide's 450 ms):

| proxy | model | added TTFT outside the prefill, median (runs) | decode, paired median |
|---|---|---|---|
| httpx forwards (before) | tiny-moe | 2.06-2.64 ms whole TTFT (3 runs of 30 pairs, server -t 2) | -29% (server -t 2) |
| aiohttp forwards, spare connection, [DONE] alone held | tiny-moe | 0.69, 0.76, 0.78 ms (60 pairs each) | -0.6% to 0.0% |
| the same | --wide (430 tokens/s) | 0.96, 1.04 ms (30, 40 pairs) | -0.8%, -0.2% |
| the same on uvloop (as shipped) | tiny-moe | 0.70 ms (60 pairs) | -0.2% |
| the same on uvloop (as shipped) | --wide | 0.81, 0.85, 0.74 ms (40 pairs each) | -1.3%, -0.6%, -0.3% |

With ``--threads 2`` (the server on both cores) the relay's CPU comes out of the server's: tiny-moe 0.90 ms outside
the prefill and decode -17% at 2,400 tokens/s; --wide 1.14 ms and -5% at 520 tokens/s. A real agent's prompt
also costs its JSON parse before it is forwarded (a request is refused, never forwarded, unless it is JSON): 0.33
ms for the 184 KB of a generated 40K-token turn.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from xover.domain.presets import make_shape
from xover.gguf.synth import write_model
from xover.llamacpp import build, process

WIDE = {"n_embd": 1024, "n_head": 16, "n_head_kv": 4, "n_ff": 2048, "n_ff_exp": 1024}


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


def _one(client: httpx.Client, url: str, body: dict) -> tuple[float, float, float]:
    """Client TTFT (s), the part of it outside the server's prefill (s) and the decode rate (content events a second
    after the first) of one streamed request."""
    times, seen, prompt_s = [], [], None
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            seen.append(line)
            if line.startswith("data: {") and '"delta":{"content"' in line.replace(" ", ""):  # a token's event
                times.append(time.perf_counter())
            if line.startswith("data: {") and '"timings"' in line:
                prompt_s = json.loads(line[len("data: ") :])["timings"]["prompt_ms"] / 1e3
    if len(times) < 2 or prompt_s is None:
        raise SystemExit(f"{url}: fewer than 2 token events or no timings (HTTP {r.status_code}: "
                         f"{' '.join(seen)[:300]!r})")  # fmt: skip
    return times[0] - t0, times[0] - t0 - prompt_s, (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=Path, default=None, help="a GGUF (default: tiny-moe, synthesized)")
    ap.add_argument("--wide", action="store_true",
                    help="tiny-moe four times as wide (about 16 times the work a token), synthesized: a real model's "
                    "decode rate on a small machine, where tiny-moe's thousands of tokens a second overstate the "
                    "relay's share")  # fmt: skip
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--length", type=int, default=512, help="prompt characters (tiny-moe: about a token each)")
    ap.add_argument("--answer", type=int, default=64, help="answer tokens")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="the server's -t")
    args = ap.parse_args()
    server_bin = Path(build.build(backend="cpu").bin_dir) / "llama-server"
    with tempfile.TemporaryDirectory() as tmp:
        shape = make_shape("tiny-moe", **(WIDE if args.wide else {}))
        model = args.model or write_model(shape, Path(tmp) / "model.gguf", seed=0).path
        sp, pp = _port(), _port()
        direct, proxied = f"http://127.0.0.1:{sp}", f"http://127.0.0.1:{pp}"
        argv = [
            str(server_bin),
            "-m",
            str(model),
            "--port",
            str(sp),
            "-c",
            "8192",
            "-np",
            "1",
            "--cache-ram",
            "0",
            "-t",
            str(args.threads),
        ]
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
                d, p = [], []
                for i in range(args.pairs):
                    order = (direct, proxied) if i % 2 == 0 else (proxied, direct)
                    got = {url: _one(client, url, body) for url in order}
                    d.append(got[direct])
                    p.append(got[proxied])
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
            process.stop(server)
    print(f"{args.pairs} pairs, {args.length}-character prompts, {args.answer}-token answers, alternating order, "
          f"server -t {args.threads} on {os.cpu_count()} cores")  # fmt: skip
    for what, i in (("TTFT", 0), ("TTFT outside the server's prefill", 1)):
        diffs = sorted((b[i] - a[i]) * 1e3 for a, b in zip(d, p))
        q = statistics.quantiles(diffs, n=4)
        added = statistics.median(diffs)
        # the target is read on the second: the first carries the prefill's own noise (wide on a long prefill)
        verdict = (
            f"; target under 1 ms: {'met' if added < 1 else 'not met'}" if i == 1 else " (the prefill's noise in it)"
        )
        print(
            f"{what}: direct median {statistics.median(x[i] for x in d) * 1e3:.2f} ms, through xover record "
            f"{statistics.median(x[i] for x in p) * 1e3:.2f} ms; added (paired) median {added:.2f} ms, IQR "
            f"{q[0]:.2f} to {q[2]:.2f} ms{verdict}"
        )
    dd, pd = statistics.median(x[2] for x in d), statistics.median(x[2] for x in p)
    ratios = sorted(b[2] / a[2] - 1 for a, b in zip(d, p))
    q = statistics.quantiles(ratios, n=4)
    print(
        f"decode: direct median {dd:.1f} events/s, through xover record {pd:.1f} events/s ({pd / dd - 1:+.1%}); "
        f"paired ratio median {statistics.median(ratios):+.1%}, IQR {q[0]:+.1%} to {q[2]:+.1%}"
    )


if __name__ == "__main__":
    main()
