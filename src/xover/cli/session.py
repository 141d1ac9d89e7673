"""`xover session`: replay an agentic coding session turn by turn, per --n-cpu-moe and cache mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from xover.cli import options
from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

if TYPE_CHECKING:
    from xover.cli.progress import Bar
    from xover.measure.session import SessionResult

HELP = """Replay an agentic coding session through llama-server's chat endpoint, turn by turn.

The session (generated from --seed unless --workload is given) is a large system prompt with tool
definitions and turns that append tool results and replies, some rewriting earlier context. Each
configuration x cache mode replays it on a freshly started server; every turn's TTFT, cache_n,
prompt_n and decode speed go to the study's results.sqlite as they arrive.

The generated session is sized for the model: when its training context cannot hold the default
40K-token session, the system prompt and final size shrink by the same factor (and the turns, to
as many as fit), and one line says so; sizes given explicitly are kept, or refused with what fits.

\b
xover session -m model.gguf --ncmoe 12,18
xover session -m tiny.gguf --turns 6 --system-tokens 1536 --target-tokens 6k
xover session -m model.gguf --ncmoe 18 --workload recorded.jsonl --exact -- -ub 1024
"""


@click.command(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@options.model("GGUF model to serve.")
@options.table_options("llama-server, one configuration per combination: ")
@click.option(
    "--workload",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Replay this session file (xover-session/1 JSONL) instead of generating one.",
)
@click.option(
    "--turns",
    type=click.IntRange(min=2),
    default=30,
    help="Turns of the generated session [default: 30, or as many as the model's training context holds].",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the generated session (same seed, same file)."
)
@click.option(
    "--system-tokens",
    default="10k",
    show_default=True,
    help="Size of the system prompt with its tool definitions (scaled with --target-tokens to fit the model).",
)
@click.option(
    "--target-tokens",
    default="40k",
    help="Prompt size the last turn grows to [default: 40k, or 95% of what the model's training context "
    "holds with the response when that is less].",
)
@options.at_least(
    0,
    "--rewrite-every",
    default=6,
    help="Every Nth turn edits a file shown earlier and rewrites that earlier result in place (0: never).",
)
@click.option(
    "--chars-per-token",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Characters per token when sizing the generated session [default: 1 for xover's synthetic byte "
    "vocabularies, else 4].",
)
@options.response_tokens(64, "Tokens generated per turn (exactly: max_tokens + ignore_eos).")
@click.option(
    "--cache-modes",
    default="default,off,reuse",
    show_default=True,
    help="default: llama-server's prompt cache; off: every turn cold (cache_prompt false, -np 1 --cache-ram 0); "
    "reuse: the defaults plus --cache-reuse.",
)
@options.at_least(1, "--cache-reuse", default=256, help="--cache-reuse chunk (tokens) of the reuse mode.")
@click.option("--exact", is_flag=True, help="Feed back the recorded replies instead of the server's own.")
@click.option(
    "--ctx-size",
    type=click.IntRange(min=256),
    default=None,
    help="llama-server -c [default: sized to the session by a short tokenizing run].",
)
@options.study_dir("Study directory: results.sqlite, logs/ and the generated session file.")
@options.llama_bin_dir()
@options.server_timeout()
@options.server_args()
@click.pass_context
def session(ctx: click.Context, system_tokens: str, target_tokens: str, cache_modes: str, **params: Any) -> None:
    from xover.cli.progress import Bar
    from xover.domain.prompts import parse_length
    from xover.measure.session import GENERATION_OPTIONS, SessionRequest, parse_modes, replay_session

    explicit = tuple(
        name
        for name in GENERATION_OPTIONS
        if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
    )
    request = SessionRequest(  # the other options pass through by name, once the swept values are taken out
        sweeps=tuple(options.table_values(params)),
        system_tokens=parse_length(system_tokens),
        target_tokens=parse_length(target_tokens),
        explicit=explicit,
        modes=parse_modes(cache_modes),
        **params,
    )
    with Bar("session turns") as bar:
        result = replay_session(request, command=["xover", *sys.argv[1:]], on_event=lambda ev: _show(ev, bar))
    _print_result(result, request.study_dir)


def _show(ev: object, bar: Bar) -> None:
    """One progress event of the replay: the bar, and a line per server, sizing, failed turn or finished replay."""
    from rich.markup import escape

    from xover.cli.progress import failed_or_noted
    from xover.console import console, safe
    from xover.measure.events import ReplayDone, ServerUp, Sized, TurnDone
    from xover.measure.session import SessionStarted

    if isinstance(ev, SessionStarted):
        if ev.sizing:
            console.print(escape(ev.sizing))  # one line: what was scaled to the model, and why
        if ev.written is not None:
            console.print(f"[dim]session written to {safe(ev.written)}[/]")
        if ev.sized:
            console.print(f"[dim]{escape(ev.sized)}[/]")
        bar.start(ev.total)
    elif failed_or_noted(ev, bar, lambda f: f"{f.label} {f.mode}"):
        return
    elif isinstance(ev, TurnDone):
        bar.advance()
        if ev.turn.error is not None:
            console.print(f"[red]{escape(f'{ev.label} {ev.turn.mode} turn {ev.turn.turn}: {ev.turn.error}')}[/]")
    elif isinstance(ev, Sized):
        console.print(f"[dim]context sized to {ev.ctx_size} tokens (longest turn {ev.max_prompt_tokens} tokens)[/]")
    elif isinstance(ev, ServerUp):
        console.print(
            f"[dim]{escape(f'llama-server {ev.label} ({ev.mode} cache) ready at {ev.url}, log {ev.log_path}')}[/]"
        )
    elif isinstance(ev, ReplayDone):
        console.print(f"{escape(ev.label)} {ev.mode}: session time {ev.total_ns / 1e9:,.2f} s")


def _print_result(result: SessionResult, study_dir: Path) -> None:
    """The replay's summary table and verdict on stdout, then where the turns are."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from xover.console import console, out, safe, stdout_console
    from xover.report.session import session_table, session_verdict

    outcome, series = result.outcome, result.series
    if series:
        header, rows = session_table(series)
        table = Table(title="agentic session replay", box=box.SIMPLE_HEAD, title_justify="left")
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*(escape(c) for c in row))
        # a terminal wraps the table to its width; a pipe or file gets it whole
        target = out if out.is_terminal else stdout_console(width=160)
        target.print(table)
        verdict = session_verdict(series)
        if verdict:
            target.print(escape(verdict))
    console.print(
        f"[dim]run {outcome.run_id}: {len(outcome.turns)} turns stored in {safe(study_dir / 'results.sqlite')}[/]"
    )
    if outcome.failures:
        raise XoverError(f"{len(outcome.failures)} replay(s) failed, first: {outcome.failures[0].reason}")
