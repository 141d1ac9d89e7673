"""How much does xover's client add to TTFT? Compare it with a minimal raw-socket client.

Both clients send the same cold request (same prompt, ``cache_prompt: false``) to the same
llama-server, alternating which goes first, for N pairs. The raw client is plain ``socket``: a
hand-written HTTP/1.1 POST, the clock started just before ``sendall`` (connection already open,
as xover's is), stopped when the first event carrying a token id has arrived. Prints the median
of the paired differences (xover - raw) of the client-server gap (TTFT - prompt_ms), which is the
client's overhead with the server's prefill variance taken out (target: under 1 ms), and of TTFT
itself, whose spread is the prefill's run-to-run variance.

    .venv/bin/python benchmarks/ttft_overhead.py                 # tiny-moe, synthesized on the fly
    .venv/bin/python benchmarks/ttft_overhead.py -m model.gguf --length 4096 --pairs 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import tempfile
import time
from pathlib import Path

from xover.analysis.stats import summarize
from xover.client.http import LlamaClient, completion_body
from xover.domain.config import LlamaConfig
from xover.domain.prompts import TokenPrompts, token_pool
from xover.llamacpp.binaries import resolve
from xover.llamacpp.server import LlamaServer, ServerLaunch, context_size, has_flag
from xover.measure.ttft import gguf_token_types

_CONTENT = re.compile(rb'"tokens":\[\d')
_TIMINGS = re.compile(rb'"timings":(\{[^}]*\})')


def raw_ttft(host: str, port: int, body: dict[str, object]) -> tuple[int, float]:
    """(TTFT in ns, server prompt_ms) of one request over a bare socket."""
    payload = json.dumps(body).encode()
    head = (
        f"POST /completion HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = head + payload
        buf = b""
        ttft: int | None = None
        t0 = time.perf_counter_ns()
        s.sendall(request)
        while True:
            chunk = s.recv(1 << 16)
            now = time.perf_counter_ns()
            if not chunk:
                break
            buf += chunk
            if ttft is None and _CONTENT.search(buf):
                ttft = now - t0
    m = _TIMINGS.search(buf)
    if ttft is None or m is None:
        raise RuntimeError(f"raw client: no content or timings in the response: {buf[:200]!r}")
    return ttft, float(json.loads(m.group(1))["prompt_ms"])


async def xover_ttft(client: LlamaClient, body: dict[str, object]) -> tuple[int, float]:
    rec = await client.stream_completion(body)
    r = rec.result
    if r.error is not None or r.first_token_ns is None or r.timings is None or r.timings.prompt_ms is None:
        raise RuntimeError(f"xover client: {r.error}")
    return r.first_token_ns, r.timings.prompt_ms


async def bench(model: Path, bin_dir: Path | None, length: int, pairs: int, response: int, threads: int | None) -> None:
    bins = resolve(bin_dir)
    config = LlamaConfig("overhead", settings=(("threads", str(threads)),) if threads is not None else ())
    spec = ServerLaunch(config, model, context_size(length, response), fit_off=has_flag(bins.server, "-fit"))
    with tempfile.TemporaryDirectory() as logs:
        async with LlamaServer(bins.server, spec, Path(logs)) as srv:
            assert srv.client is not None
            host, port = srv.url.removeprefix("http://").split(":")
            maker = TokenPrompts(token_pool(gguf_token_types(model)), seed=time.time_ns() % 1_000_003)
            await xover_ttft(srv.client, completion_body(maker.make(0, 8).prompt, 4, cache_prompt=False))  # warm-up
            d_ttft, d_gap, xs, rs = [], [], [], []
            for i in range(pairs):
                body = completion_body(maker.make(i + 1, length).prompt, response, cache_prompt=False)
                if i % 2 == 0:
                    x = await xover_ttft(srv.client, body)
                    r = raw_ttft(host, int(port), body)
                else:
                    r = raw_ttft(host, int(port), body)
                    x = await xover_ttft(srv.client, body)
                xs.append(x[0])
                rs.append(r[0])
                d_ttft.append(x[0] - r[0])
                d_gap.append((x[0] - x[1] * 1e6) - (r[0] - r[1] * 1e6))
    ms = 1e6
    sx, sr, st, sg = summarize(xs), summarize(rs), summarize(d_ttft), summarize(d_gap)
    print(f"llama-server {srv.props.get('build_info')}, {model.name}, L={length}, response {response}, {pairs} pairs")
    print(f"median TTFT: xover {sx.median / ms:.3f} ms, raw socket {sr.median / ms:.3f} ms")
    print(
        f"median paired difference, xover - raw: gap (TTFT - prompt_ms) {sg.median / ms:+.3f} ms "
        f"(IQR {sg.q1 / ms:+.3f} .. {sg.q3 / ms:+.3f}); "
        f"TTFT {st.median / ms:+.3f} ms (IQR {st.q1 / ms:+.3f} .. {st.q3 / ms:+.3f})"
    )
    print("client overhead target (median gap difference < 1 ms):", "met" if abs(sg.median) < ms else "NOT met")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, default=None, help="GGUF to serve [default: tiny-moe, synthesized]")
    p.add_argument("--llama-bin-dir", type=Path, default=None)
    p.add_argument("--length", type=int, default=512, help="prompt tokens")
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--response-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from xover.domain.presets import PRESETS
            from xover.gguf.synth import write_model

            model = Path(tmp) / "tiny-moe.gguf"
            write_model(PRESETS["tiny-moe"], model, seed=0)
        asyncio.run(bench(model, a.llama_bin_dir, a.length, a.pairs, a.response_tokens, a.threads))


if __name__ == "__main__":
    main()
