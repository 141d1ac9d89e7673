"""`xover session`: replay an agentic coding session turn by turn, per --n-cpu-moe and cache mode."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from xover.cli import options
from xover.errors import XoverError

if TYPE_CHECKING:
    from xover.domain.config import LlamaConfig
    from xover.domain.workload import WorkloadSpec
    from xover.gguf.inspect import ModelContext
    from xover.llamacpp.binaries import Binaries
    from xover.measure.events import Sized

_GENERATION_OPTIONS = ("turns", "seed", "system_tokens", "target_tokens", "rewrite_every", "chars_per_token")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
def session(
    ctx: click.Context,
    model: Path,
    workload: Path | None,
    turns: int,
    seed: int,
    system_tokens: str,
    target_tokens: str,
    rewrite_every: int,
    chars_per_token: float | None,
    response_tokens: int,
    cache_modes: str,
    cache_reuse: int,
    exact: bool,
    ctx_size: int | None,
    study_dir: Path,
    llama_bin_dir: Path | None,
    server_timeout: float,
    extra_args: tuple[str, ...],
    **swept: tuple[str, ...],
) -> None:
    """Replay an agentic coding session through llama-server's chat endpoint, turn by turn.

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
    from rich.markup import escape

    from xover.cli.progress import failed_or_noted
    from xover.console import console, out, progress_bar, safe
    from xover.domain.prompts import parse_length
    from xover.domain.workload import WorkloadSpec, fit_to_context, loads
    from xover.llamacpp.binaries import resolve
    from xover.measure.events import ReplayDone, ServerUp, SessionEvent, Sized, TurnDone
    from xover.measure.session import parse_modes, run_session, write_workload
    from xover.report.session import session_table, session_verdict
    from xover.results.read_model import series_from_rows

    if not model.is_file():
        raise XoverError(f"model {model} does not exist: fix -m")
    modes = parse_modes(cache_modes)
    from xover.gguf.inspect import check_offload_and_context, model_context
    from xover.llamacpp.server import check_explicit_context

    context = model_context(model)
    spec: WorkloadSpec | None = None
    requested: WorkloadSpec | None = None
    given: frozenset[str] = frozenset()
    vocab = ""
    if workload is None:
        given = frozenset(
            name
            for name in ("turns", "system_tokens", "target_tokens")
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        )
        byte_vocab = chars_per_token is None and context.byte_vocab
        requested = WorkloadSpec(
            seed=seed,
            turns=turns,
            system_tokens=parse_length(system_tokens),
            target_tokens=parse_length(target_tokens),
            rewrite_every=rewrite_every,
            chars_per_token=chars_per_token or (1.0 if byte_vocab else 4.0),
        )
        spec, line = fit_to_context(requested, context.n_ctx_train, response_tokens, given, context.name)
        vocab = "sized at 1 character per token (xover's synthetic byte vocabulary)" if byte_vocab else ""
    from xover.domain.config import matrix
    from xover.domain.llama_options import parse_args

    sweeps = options.table_values(swept)
    known, rest = parse_args(extra_args, "server")
    configs = [c.with_values({**known, **dict(c.settings)}) for c in matrix(sweeps, server_args=rest)]
    need = None if spec is None else spec.target_tokens + response_tokens
    check_offload_and_context(model, [c.n_cpu_moe for c in configs if c.get("n-cpu-moe") is not None], need)
    if need is not None:
        check_explicit_context(extra_args, need)
        if ctx_size is not None and ctx_size < need:
            raise XoverError(
                f"--ctx-size {ctx_size} is shorter than the session's last turn plus its response "
                f"(about {need} tokens): raise it or leave it out (xover sizes it)"
            )
    if spec is None:
        assert workload is not None
        shaping = [
            name
            for name in _GENERATION_OPTIONS
            if ctx.get_parameter_source(name) not in (click.core.ParameterSource.DEFAULT, None)
        ]
        if shaping:
            raise XoverError(
                f"--{shaping[0].replace('_', '-')} shapes a generated session; --workload replays a file: drop one"
            )
        if not workload.is_file():
            raise XoverError(f"workload {workload} does not exist: fix --workload")

    binaries = resolve(llama_bin_dir)

    if spec is not None and requested is not None:
        sized = None
        if context.n_ctx_train and ctx_size is None:
            # the real token counts, and what the server's own replies become when fed back, decide
            spec, line, sized = _fit_by_sizing(
                requested,
                spec,
                line,
                given,
                context,
                response_tokens,
                exact,
                binaries,
                model.resolve(),
                configs[0],
                study_dir,
                server_timeout,
            )
            ctx_size = sized.ctx_size
        sizing = "; ".join(x for x in (line, vocab) if x)
        if sizing:
            console.print(escape(sizing))  # one line: what was scaled to the model, and why
        path = write_workload(study_dir, spec)
        console.print(f"[dim]session written to {safe(path)}[/]")
        if sized is not None:
            console.print(
                f"[dim]context sized to {sized.ctx_size} tokens (longest turn {sized.max_prompt_tokens} "
                f"tokens; llama-server holds at most {context.n_ctx_train:,} per slot)[/]"
            )
    else:
        assert workload is not None
        path = workload
    n_turns = len(loads(path.read_text(encoding="utf-8"), source=str(path)).turns)

    with progress_bar() as bar:
        task = bar.add_task("session turns", total=len(configs) * len(modes) * n_turns)

        def on_event(ev: SessionEvent) -> None:
            if failed_or_noted(ev, bar, task, lambda f: f"{f.label} {f.mode}"):
                return
            if isinstance(ev, TurnDone):
                bar.update(task, advance=1)
                if ev.turn.error is not None:
                    console.print(f"[red]{escape(f'{ev.label} {ev.mode} turn {ev.turn.turn}: {ev.turn.error}')}[/]")
            elif isinstance(ev, Sized):
                console.print(
                    f"[dim]context sized to {ev.ctx_size} tokens (longest turn {ev.max_prompt_tokens} tokens)[/]"
                )
                if context.n_ctx_train and ev.need_tokens > context.n_ctx_train:
                    replies = (
                        ""
                        if ev.reply_growth is None
                        else f"; each fed-back reply of {response_tokens} tokens comes back as about "
                        f"{ev.reply_growth * response_tokens:,.0f} (--exact feeds the recorded replies)"
                    )
                    beyond = (
                        f"the longest turn needs {ev.need_tokens:,} tokens, beyond {context.name}'s training context "
                        f"of {context.n_ctx_train:,}: llama-server caps a slot there, so turns past it fail{replies}"
                    )
                    console.print(f"[yellow]{escape(beyond)}[/]")
            elif isinstance(ev, ServerUp):
                console.print(
                    f"[dim]{escape(f'llama-server {ev.label} ({ev.mode} cache) ready at {ev.url}, log {ev.log_path}')}[/]"
                )
            elif isinstance(ev, ReplayDone):
                console.print(f"{escape(ev.label)} {ev.mode}: session time {ev.total_ns / 1e9:,.2f} s")

        outcome = run_session(
            study_dir,
            binaries,
            model.resolve(),
            path,
            configs,
            modes,
            response_tokens,
            exact=exact,
            cache_reuse=cache_reuse,
            ctx_size=ctx_size,
            command=["xover", *sys.argv[1:]],
            startup_timeout_s=server_timeout,
            on_event=on_event,
        )

    series = series_from_rows((outcome.run_id, outcome.labels[t.config_key], t) for t in outcome.turns)
    if series:
        from rich import box
        from rich.table import Table

        from xover.console import stdout_console

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


def _fit_by_sizing(
    requested: WorkloadSpec,
    spec: WorkloadSpec,
    line: str | None,
    given: frozenset[str],
    context: ModelContext,
    response_tokens: int,
    exact: bool,
    binaries: Binaries,
    model: Path,
    config: LlamaConfig,
    study_dir: Path,
    startup_timeout_s: float,
) -> tuple[WorkloadSpec, str | None, Sized]:
    """The generated session refitted until its real size fits the model's training context.

    llama-server caps a slot at the training context, so the longest turn, with the replies fed back
    and the response, must fit it. A sizing server (what the replay would start anyway) tokenizes every
    turn and measures what a generated reply becomes when fed back; while the session does not fit, it
    is refitted with that reply size and the tokenizer's excess over the estimate reserved. Returns the
    session spec, its one-line description and the sizing (whose context the replay then uses)."""
    import asyncio

    from xover.domain.workload import fit_to_context, generate, last_turn_tokens
    from xover.llamacpp.server import has_flag
    from xover.measure.session import reply_allowance, size_context

    reply, slack = 0, 0
    for _ in range(4):
        session = generate(spec)
        sized = asyncio.run(
            size_context(
                binaries,
                model,
                config,
                session,
                exact,
                response_tokens,
                study_dir / "logs",
                has_flag(binaries.server, "-fit"),
                startup_timeout_s,
            )
        )
        if sized.need_tokens <= context.n_ctx_train:
            return spec, line, sized
        if not exact:
            reply = max(reply, reply_allowance(sized.reply_growth, response_tokens))
        slack += max(0, sized.max_prompt_tokens - last_turn_tokens(spec)) + 64
        spec, line = fit_to_context(
            requested, context.n_ctx_train, response_tokens, given, context.name, reply_tokens=reply, slack=slack
        )
        if line is None:  # every size was given: nothing left to scale
            break
    raise XoverError(
        f"the session's longest turn needs {sized.need_tokens:,} tokens with its response"
        + ("" if exact else " and the fed-back replies")
        + f", beyond {context.name}'s training context of "
        f"{context.n_ctx_train:,} (llama-server caps a slot there): lower --target-tokens or --turns"
        + ("" if exact else ", or replay --exact")
    )
