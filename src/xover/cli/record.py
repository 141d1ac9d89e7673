"""`xover record`: a recording pass-through in front of the user's llama-server."""

from __future__ import annotations

from pathlib import Path

import click

from xover.console import console, safe

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


@click.command()
@click.option(
    "--upstream",
    "-u",
    default=None,
    help="The llama-server (or ik_llama.cpp server) to forward to, e.g. http://127.0.0.1:8080.",
)
@click.option(
    "--from-log",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Instead of a proxy: import the requests a llama-server (llama.cpp or ik_llama.cpp) already logged, at its "
    "default verbosity, as a shape-only recording at --out.",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("rec.jsonl"),
    show_default=True,
    help="The recording (JSONL, appended to, created 0600).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Where to listen: loopback unless told otherwise.")
@click.option("--port", "-p", default=8090, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@click.option(
    "--max-body",
    default=32 << 20,
    show_default=True,
    type=click.IntRange(min=1024),
    help="Largest request body in bytes; a larger one is refused and forwarded nowhere.",
)
@click.option(
    "--shape-only",
    is_flag=True,
    help="Keep no text: per message its role, per block its token length and a keyed hash (see below).",
)
@click.option(
    "--key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The key of --shape-only's hashes (made, 0600, where missing). [default: record.key in xover's cache]",
)
def record(
    upstream: str | None,
    from_log: Path | None,
    out: Path,
    host: str,
    port: int,
    max_body: int,
    shape_only: bool,
    key_file: Path | None,
) -> None:
    """Record your agent's real turns: point the client at this proxy instead of llama-server.

    \b
    llama-server -m model.gguf --port 8080 ...          # your server, as always
    xover record --upstream http://127.0.0.1:8080       # listens on 127.0.0.1:8090
    # then set the agent's base URL to http://127.0.0.1:8090/v1

    Every request and every byte of every answer is passed through unchanged (streams chunk by chunk). Per request
    it records the prompt's tokens, the part served from the server's cache (cache_n), the answer's tokens, TTFT and
    decode as your client saw them, and the time since the previous request. Chat requests are also the turns of an
    xover-session/1 file: `xover session --workload rec.jsonl` replays them.

    What each mode stores. Full (the default): every chat request's messages and the reply, as sent and received,
    with the timings above: your prompts and code, written 0600, on this machine only. --shape-only: no text at all;
    per message its role, per block of text (a message's content, each text part, its tool calls) the block's length
    in the server's tokens and an HMAC-SHA256 of it under a key kept in --key-file, never in the recording; plus the
    same timings. Equal blocks hash alike, so the shared prefixes and rewritten context that decide the server's
    cache are kept; `xover session` and `xover study --workload` replay it with synthetic text of the same token
    lengths.

    --from-log FILE reads a server's log instead (its stderr, or --log-file): per request the prompt's tokens, the
    prefix taken from the cache, the answer's tokens and the server's times, written as a shape-only recording (the
    log holds no text); each turn is one message whose cached prefix repeats the slot's previous context.

    Ctrl-C stops the proxy; every completed request is already on disk.
    """
    from xover.proxy.record import Seen, import_log, serve, shape_key

    if (upstream is None) == (from_log is None):
        raise click.UsageError("give --upstream URL (record through the proxy) or --from-log FILE (import a log)")
    if from_log is not None:
        engine, turns = import_log(from_log, out)
        console.print(safe(f"{out}: {turns} requests from {from_log} ({engine}'s log), shape-only"))
        return
    assert upstream is not None

    def show(seen: Seen) -> None:
        cached = f", {seen.cached_tokens:,} from cache" if seen.cached_tokens is not None else ""
        ttft = f", TTFT {seen.ttft_s:.2f} s" if seen.ttft_s is not None else ""
        decode = f", {seen.decode_tps:.1f} t/s" if seen.decode_tps is not None else ""
        err = f" [{seen.error}]" if seen.error else ""
        console.print(
            safe(f"{seen.path}: {seen.prompt_tokens or 0:,} prompt tokens{cached}, {seen.answer_tokens or 0:,} answer"
                 f"{ttft}{decode}{err}")
        )  # fmt: skip

    mode = " (shape-only: no text)" if shape_only else ""
    serve(upstream, out, host, port, max_body, on_seen=show, key=shape_key(key_file) if shape_only else None,
          on_ready=lambda url: console.print(safe(f"recording to {out}{mode}; point your client at {url}/v1")))  # fmt: skip
