"""Blob against chat: does a many-message chat prompt prefill slower per token than one token array of the same length?

xover's cold prompts are one token array on ``/completion``; agents send ``/v1/chat/completions`` with a system
prompt, tool results and many user/assistant turns. This benchmark measures both shapes at the same token count on
the same fresh llama-server, in rounds of fresh servers, configurations interleaved (the order alternates from round
to round), and says whether the difference exceeds the noise between servers:

- **chat**: the study's own chat-shaped prompt (:mod:`xover.domain.chat_prompts`): the last turn of a session from
  xover's agentic session generator (a Cline-like system prompt, tool results, user/assistant turns;
  ``--messages-per-1k`` messages per 1,024 tokens), exactly the length as the server counts it with its template;
- **blob**: as many unique token ids on ``/completion``, so both shapes prefill the same number of tokens.

Every server is warmed through the prompt path first (a prompt that fills its largest ubatch, then one of the
shortest length; both discarded). Each request is cold (``cache_prompt: false``, one slot, no host prompt cache) and
must say so: a sample whose ``timings.cache_n`` is not 0 is kept in the raw file and left out of every figure. Fresh
text for every request (the generator's seed and the blob's ids change). Within a server, which shape goes first
alternates by round and length.

Per configuration and length it prints chat's time per prompt token over blob's, paired within each server and
summarised over the rounds (geometric mean and 95% t interval, as xover's rounds rule): "indistinguishable here"
unless the interval excludes 1. With two configurations of one model (the whole model on the GPU against experts on
the CPU), it also prints the second's penalty over the first for each shape, and where the two configurations' total
time per turn (TTFT and ``--response`` answer tokens) crosses for each shape, fitted as xover's crossover is:
whether chat-shaped prompts move the crossover, and by how much.

    .venv/bin/python benchmarks/chat_shape.py -m tiny-moe.gguf --lengths 1k,2k --rounds 3
    python3 -m benchmarks.chat_shape -m qwen3.gguf --config gpu= --config "cpu18=--n-cpu-moe 18 -lm none -ub 4096" \\
        --lengths 16k,32k --rounds 3 -o out/chat-qwen3

Raw samples go to ``OUT/samples.jsonl`` as they are measured (with each server's arguments, build and devices), the
summary to ``OUT/summary.md``; the servers' logs to ``OUT/logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xover.analysis import rounds as rounds_rule
from xover.analysis.crossover import ConfigData, compare_pair
from xover.client.chat import ChatClient, ChatStream, chat_body
from xover.client.http import completion_body
from xover.domain import llama_options as opts
from xover.domain.chat_prompts import ChatPrompts
from xover.domain.config import LlamaConfig
from xover.domain.prompts import TokenPrompts, parse_lengths, token_pool
from xover.domain.sse import CompletionStream
from xover.llamacpp.binaries import resolve
from xover.llamacpp.server import (
    LlamaServer,
    ServerLaunch,
    buffer_log_verbosity,
    context_size,
    device_problem,
    has_flag,
)
from xover.measure.server_session import warm_up, warmup_lengths
from xover.measure.ttft import gguf_token_types

SHAPES = ("blob", "chat")


def parse_config(text: str, backend: str | None) -> LlamaConfig:
    """``NAME=ARGS``: a configuration named NAME of llama-server's ARGS (the option table's flags become settings)."""
    name, sep, args = text.partition("=")
    if not sep or not name.strip():
        raise SystemExit(f"--config {text!r}: write NAME=ARGS, e.g. cpu12='--n-cpu-moe 12 -lm none'")
    known, rest = opts.parse_args(shlex.split(args), "server")
    return LlamaConfig(name=name.strip(), backend=backend, server_args=tuple(rest)).with_values(known)


def _log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


async def one_server(
    args: argparse.Namespace,
    config: LlamaConfig,
    round_no: int,
    prompts: TokenPrompts,
    chats: ChatPrompts,
    out: Path,
    rows: list[dict[str, Any]],
) -> None:
    bins = resolve(args.llama_bin_dir, backend=config.backend)
    longest = max(args.lengths)
    spec = ServerLaunch(
        config,
        args.model,
        context_size(longest, args.decode_tokens + 64),
        fit_off=has_flag(bins.server, "-fit"),
        label=f"{config.name}-r{round_no}",
        log_verbosity=buffer_log_verbosity(bins.server),  # the load log names the devices it ran on
    )
    sink = out / "samples.jsonl"

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        with sink.open("a") as f:
            f.write(json.dumps(row) + "\n")

    async with LlamaServer(bins.server, spec, out / "logs") as srv, ChatClient(srv.url) as client:
        problem, devices = device_problem(srv.log_path, bins.expected_backend)
        if problem is not None:
            raise SystemExit(problem)
        keep(
            {
                "server": config.name,
                "round": round_no,
                "args": list(spec.args()),
                "build": srv.props.get("build_info"),
                "devices": [f"{d} ({desc})" for d, desc in devices],
                "binary": str(bins.server),
            }
        )
        t0 = time.perf_counter()
        warm = warmup_lengths(config, bins.backend, spec.ctx_size, min(args.lengths))
        failed = await warm_up(
            client, [prompts.make(10_000 * round_no + 9_000 + i, n).prompt for i, n in enumerate(warm)]
        )
        if failed is not None:
            raise SystemExit(f"{config.name} round {round_no}: {failed}")
        _log(
            f"{config.name} round {round_no}: warmed up ({', '.join(map(str, warm))} tokens, {time.perf_counter() - t0:.1f} s)"
        )

        for li, length in enumerate(rounds_rule.rotated(args.lengths, round_no - 1)):
            chat = await chats.make(10_000 * round_no + li, length, client)
            msgs, n = list(chat.messages), chat.length
            blob = prompts.make(10_000 * round_no + li, n).prompt
            order = SHAPES if (round_no + li) % 2 else SHAPES[::-1]
            for shape in order:
                r: ChatStream | CompletionStream
                if shape == "chat":
                    r = (await client.stream_chat(chat_body(msgs, args.decode_tokens, cache_prompt=False))).result
                else:
                    body = completion_body(blob, args.decode_tokens, cache_prompt=False)
                    r = (await client.stream_completion(body)).result
                tm = r.timings
                keep(
                    {
                        "config": config.name,
                        "round": round_no,
                        "length": length,
                        "shape": shape,
                        "messages": len(msgs) if shape == "chat" else 1,
                        "tokens": n,
                        "first": shape == order[0] and li == 0,
                        "prompt_n": tm.prompt_n if tm else None,
                        "cache_n": tm.cache_n if tm else None,
                        "prompt_ms": tm.prompt_ms if tm else None,
                        "decode_tps": tm.predicted_per_second if tm else None,
                        "ttft_ms": r.first_token_ns / 1e6 if r.first_token_ns is not None else None,
                        "error": r.error,
                    }
                )
                rate = f"{tm.prompt_n / tm.prompt_ms * 1e3:,.0f} t/s" if tm and tm.prompt_n and tm.prompt_ms else "-"
                _log(
                    f"  {config.name} r{round_no} {length} {shape}: {n} tokens, {len(msgs) if shape == 'chat' else 1} "
                    f"messages, prefill {rate}, cache_n {tm.cache_n if tm else '-'}{'; ' + r.error if r.error else ''}"
                )


def cold(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples that count: answered, proven cold, the whole prompt evaluated."""
    return [
        r
        for r in rows
        if "shape" in r and r["error"] is None and r["cache_n"] == 0 and r["prompt_ms"] and r["prompt_n"] == r["tokens"]
    ]


def per_round(rows: Sequence[dict[str, Any]], config: str, length: int, shape: str, key: str) -> dict[int, float]:
    """Round -> the value of ``key`` (ms per prompt token, or decode t/s) of that round's server."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if r["config"] == config and r["length"] == length and r["shape"] == shape:
            v = r["prompt_ms"] / r["prompt_n"] if key == "ms_per_token" else r[key]
            if v:
                by.setdefault(r["round"], []).append(v)
    return {k: statistics.median(v) for k, v in by.items()}


def describe(iv: rounds_rule.RatioInterval | None, what: str) -> str:
    if rounds_rule.too_few(iv) or iv is None:
        n = 0 if iv is None else iv.n
        return f"{what}: not yet compared ({n} shared rounds; a verdict needs {rounds_rule.MIN_ROUNDS})"
    verdict = "differ" if iv.decided else "indistinguishable here"
    return f"{what} {iv.ratio:.3f}x ({iv.low:.3f}-{iv.high:.3f}, {iv.n} rounds): {verdict}"


def config_data(rows: Sequence[dict[str, Any]], config: str, shape: str, lengths: Sequence[int]) -> ConfigData:
    """A configuration's cold samples of one shape as xover's crossover reads them (TTFT as the server's prompt time
    scaled to the nominal length, so both shapes sit at the same lengths; decode at that depth)."""
    ttft: dict[int, list[float]] = {}
    tps: dict[int, list[float]] = {}
    by_round: dict[int, dict[int, tuple[float, float]]] = {}
    for L in lengths:
        ms = per_round(rows, config, L, shape, "ms_per_token")
        dec = per_round(rows, config, L, shape, "decode_tps")
        ttft[L] = [v * L / 1e3 for v in ms.values()]
        tps[L] = list(dec.values())
        by_round[L] = {r: (ms[r] * L / 1e3, dec[r]) for r in ms if r in dec}
    return ConfigData(label=f"{config} ({shape})", ttft_s=ttft, decode_tps=tps, rounds=by_round)


def summary(rows: Sequence[dict[str, Any]], configs: Sequence[str], lengths: Sequence[int], response: int) -> str:
    good = cold(rows)
    dropped = sum(1 for r in rows if "shape" in r) - len(good)
    servers = [r for r in rows if "server" in r]
    out = ["# Blob against chat", ""]
    if servers:
        s = servers[0]
        out.append(f"build {s['build']}; devices {', '.join(s['devices']) or 'CPU'}; {len(servers)} servers")
    out.append(f"{len(good)} cold samples ({dropped} left out: not proven cold, failed or cut)")
    out += [
        "",
        "| configuration | length | messages | blob prefill t/s | chat prefill t/s | chat/blob time per token |",
    ]
    out.append("|---|---|---|---|---|---|")
    for c in configs:
        for L in lengths:
            bl = per_round(good, c, L, "blob", "ms_per_token")
            ch = per_round(good, c, L, "chat", "ms_per_token")
            msgs = sorted(
                {r["messages"] for r in good if r["config"] == c and r["length"] == L and r["shape"] == "chat"}
            )
            rate = lambda d: f"{1e3 / statistics.median(d.values()):,.0f}" if d else "-"  # noqa: E731
            iv = rounds_rule.paired_ratio(ch, bl)
            out.append(
                f"| {c} | {L} | {'-'.join(map(str, msgs[:1] + msgs[-1:]))} | {rate(bl)} | {rate(ch)} | {describe(iv, 'chat/blob')} |"
            )
    if len(configs) == 2:
        a, b = configs[0], configs[1]
        out += ["", f"## {b} against {a}, per shape", ""]
        for L in lengths:
            for shape in SHAPES:
                iv = rounds_rule.paired_ratio(
                    per_round(good, b, L, shape, "ms_per_token"), per_round(good, a, L, shape, "ms_per_token")
                )
                out.append(f"- {L} tokens, {shape}: {describe(iv, f'{b} prefill time over {a}')}")
        out += [
            "",
            f"## Where the total time per turn crosses ({response}-token answers; fitted as xover's crossover)",
            "",
        ]
        for shape in SHAPES:
            if not all(per_round(good, c, L, shape, "ms_per_token") for c in configs for L in lengths):
                out.append(f"- {shape}: not every length measured on both; no crossing fitted")
                continue
            pair = compare_pair(config_data(good, a, shape, lengths), config_data(good, b, shape, lengths), response)
            totals = ", ".join(
                f"{L}: {ta:.2f} / {tb:.2f} s" for L, ta, tb in zip(pair.lengths, pair.total_a, pair.total_b)
            )
            cross = ", ".join(
                f"{x.length:,.0f} tokens ({x.kind}{', extrapolated' if x.extrapolated else ''})" for x in pair.fitted
            )
            out.append(f"- {shape}: totals {a} / {b} {totals}; crossing: {cross or 'none within the fitted range'}")
    return "\n".join(out) + "\n"


async def main_async(args: argparse.Namespace) -> None:
    configs = [parse_config(c, args.backend) for c in args.config] or [LlamaConfig("default", backend=args.backend)]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise SystemExit("--config: give each configuration its own name")
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    pool = token_pool(gguf_token_types(args.model))
    prompts = TokenPrompts(pool, seed=args.seed)
    chats = ChatPrompts(pool, seed=args.seed, per_1k=args.messages_per_1k)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        for r in range(1, args.rounds + 1):
            for name in rounds_rule.order(names, r - 1):
                await one_server(args, configs[names.index(name)], r, prompts, chats, out, rows)
            done = r / args.rounds
            _log(
                f"round {r}/{args.rounds} done; about {(time.perf_counter() - t0) * (1 - done) / done / 60:.1f} min left"
            )
    finally:
        text = summary(rows, names, args.lengths, args.response)
        (out / "summary.md").write_text(text)
        print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", type=Path, required=True)
    p.add_argument("--config", action="append", default=[], help="NAME=LLAMA-SERVER-ARGS (repeat; default: defaults)")
    p.add_argument("--backend", default=None, help="the build to take (cuda, vulkan, cpu; default: any)")
    p.add_argument("--llama-bin-dir", type=Path, default=None)
    p.add_argument("--lengths", type=parse_lengths, default=parse_lengths("16k,32k"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages-per-1k", type=float, default=3.0, help="chat messages per 1,024 tokens (default 3)")
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens each request generates (decode rate)")
    p.add_argument("--response", type=int, default=200, help="answer tokens a turn's total counts (crossover)")
    p.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    p.add_argument("-o", "--out", type=Path, default=Path("chat-shape"))
    args = p.parse_args()
    if not args.model.is_file():
        sys.exit(f"-m {args.model}: no such file")
    if args.rounds < 1 or not math.isfinite(args.messages_per_1k) or args.messages_per_1k <= 0:
        sys.exit("--rounds must be at least 1 and --messages-per-1k positive")
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit("interrupted: the samples measured so far are in samples.jsonl and summary.md")


if __name__ == "__main__":
    main()
