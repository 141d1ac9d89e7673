"""`xover ttft`: time-to-first-token through llama-server, every cold sample proven cold."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from xover.cli import options
from xover.domain.records import TTFT_MODES
from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

if TYPE_CHECKING:
    from rich.table import Table

    from xover.analysis.stats import Summary
    from xover.cli.progress import Bar
    from xover.measure.ttft import PointSummary, TtftResult

API_KEY_ENV = "XOVER_API_KEY"

HELP = """Time-to-first-token, prefill and decode speed through llama-server, per configuration and prompt length.

A configuration is one combination of the knob values given (--ncmoe x --load-mode x --ubatch x
--batch x ... x each --env), labelled like `xover bench`'s.
Each configuration's server starts once (-c sized to the longest prompt, -ngl 99, -fit off,
-np 1 --cache-ram 0, -lv 4 so its log carries buffer sizes), answers one discarded warm-up
request, then every length x repetition. Every sample is checked against the server's
cache_n/prompt_n; one that fails is stored, never averaged, and re-run. Samples go to the
study's results.sqlite as they arrive, and each server's peak memory (VmHWM, logged buffers)
beside them.

\b
xover ttft -m model.gguf --ncmoe 12,18 --lengths 1k,4k,16k,32k -R 200 -r 3
xover ttft -m model.gguf --ncmoe 18 --load-mode none,mmap --ubatch 512,2048
xover ttft --url http://127.0.0.1:8080 --lengths 4k
"""


@click.command(help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@options.model(
    "GGUF model to serve (with --url: optional, only used to pick prompt token ids and identify results).",
    required=False,
)
@options.lengths("1k,4k,16k,32k")
@options.response_tokens(200, "Tokens generated per request (exactly: ignore_eos).")
@options.at_least(1, "-r", "--reps", default=3, help="Repetitions per length.")
@options.study_dir("Study directory: results.sqlite and logs/.")
@options.table_options("llama-server, swept: ")
@options.env_sweep(
    "Environment variable for the server, swept, repeatable: e.g. --env GGML_OP_OFFLOAD_MIN_BATCH=32,4096."
)
@click.option(
    "--mode",
    type=click.Choice(TTFT_MODES),
    default="cold",
    show_default=True,
    help="cold: unique prompts, cache_prompt false, -np 1 --cache-ram 0, checked cache_n == 0 and prompt_n == L. "
    "warm: each prompt sent twice with cache_prompt true, the second checked cache_n == L-1 and prompt_n == 1.",
)
@click.option(
    "--text", is_flag=True, help="Text prompts counted with the server's /tokenize instead of token-id prompts."
)
@click.option(
    "--url",
    default=None,
    help="Measure the llama-server already running here (no lifecycle; same checks). "
    f"An API key is read from ${API_KEY_ENV} and sent only to this URL.",
)
@options.llama_bin_dir()
@options.server_timeout()
@options.at_least(
    0,
    "--retries",
    "max_retries",
    default=2,
    help="Re-runs of a sample that fails its cache check (it is stored, never averaged).",
)
@click.option(
    "--seed", type=int, default=None, help="Prompt seed [default: from the clock, so runs never share prompts]."
)
@options.vram_budget("run")
@options.server_args()
def ttft(
    lengths: str, seed: int | None, env: tuple[str, ...], url: str | None, vram_budget: str | None, **params: Any
) -> None:
    from xover.cli.progress import Bar
    from xover.domain.prompts import parse_lengths
    from xover.measure.ttft import TtftPlan, TtftRequest, run_ttft

    plan = TtftPlan(
        lengths=parse_lengths(lengths),
        seed=seed if seed is not None else time.time_ns() % 1_000_000_007,
        **options.taken(params, TtftPlan),
    )
    request = TtftRequest(  # the other options pass through by name, once the swept values are taken out
        plan=plan,
        sweeps=tuple(options.table_values(params)),
        env=options.parse_env(env),
        url=url,
        api_key=(os.environ.get(API_KEY_ENV) or None) if url is not None else None,
        vram_budget=options.budget(vram_budget),
        **params,
    )
    with Bar("ttft requests") as bar:
        result = run_ttft(request, command=["xover", *sys.argv[1:]], on_event=lambda ev: _show(ev, bar))
    _print_result(result, plan.mode)


def _show(ev: object, bar: Bar) -> None:
    """One progress event of the run: the bar, and a line for what went wrong or was re-run."""
    from rich.markup import escape

    from xover.cli.progress import failed_or_noted
    from xover.console import console
    from xover.measure.events import Rerun, SampleDone, ServerUp
    from xover.measure.ttft import TtftStarted

    if isinstance(ev, TtftStarted):
        if ev.hold is not None:
            console.print(f"[dim]{escape(ev.hold)}[/]")
        for expected in ev.expected:
            console.print(f"[yellow]{escape(expected)}[/]")
        bar.start(ev.total)
    elif failed_or_noted(ev, bar, lambda f: f.label):
        return
    elif isinstance(ev, SampleDone):
        bar.advance()
        s = ev.sample
        if s.error is not None:
            console.print(f"[red]{escape(f'{ev.label} L={s.length} rep {s.rep + 1}: {s.error}')}[/]")
        elif ev.check is not None:
            console.print(
                f"[yellow]{escape(f'{ev.label} L={s.length} rep {s.rep + 1}: {ev.check}')}; stored, not averaged[/]"
            )
    elif isinstance(ev, Rerun):
        bar.grow()
        console.print(
            f"[dim]{escape(ev.label)} L={ev.point.length} rep {ev.point.rep + 1}: re-running with a fresh prompt[/]"
        )
    elif isinstance(ev, ServerUp):
        where = f", log {ev.log_path}" if ev.log_path else ""
        line = f"llama-server {ev.label} ready at {ev.url} (build {ev.build_info or 'unknown'}){where}"
        console.print(f"[dim]{escape(line)}[/]")


def _print_result(result: TtftResult, mode: str) -> None:
    """The summary table on stdout, then the warnings, each server's peak memory and where the samples are."""
    from rich.markup import escape

    from xover.console import console, out, safe, stdout_console

    outcome = result.outcome
    if result.summaries:
        # a terminal wraps the table to its width; a pipe or file gets it whole
        target = out if out.is_terminal else stdout_console(width=160)
        target.print(render_table(result.summaries, outcome.labels, mode))
    for warning in result.warnings:
        console.print(f"[yellow]warning: {escape(warning)}[/]")
    for label, memory in result.memory:
        console.print(f"[dim]memory {escape(label)}: {escape(memory)}[/]")
    console.print(f"[dim]run {outcome.run_id}: {len(outcome.samples)} samples in {safe(result.store_path)}[/]")
    if outcome.failures:
        raise XoverError(f"{len(outcome.failures)} configuration(s) failed, first: {outcome.failures[0].reason}")


def _ms(ns: float) -> str:
    ms = ns / 1e6
    return f"{ms:.1f}" if ms < 100 else f"{ms:,.0f}"


def _tps(s: Summary | None) -> str:
    return "-" if s is None else f"{s.median:,.0f}"


def render_table(summaries: Sequence[PointSummary], labels: Mapping[str, str], mode: str) -> Table:
    """One row per configuration and length: medians over samples that passed the cache check."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    t = Table(
        title=f"time to first token, {mode} (medians over samples that passed the {mode} check)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    t.add_column("config")
    for name in (
        "L",
        "TTFT ms",
        "q1-q3 ms",
        "prefill tok/s\nL/TTFT | server",
        "decode tok/s\nclient | server",
        f"{mode} check\npassed/total",
        "re-runs",
        "gap ms\nTTFT-prompt_ms",
    ):
        t.add_column(name, justify="right")
    for p in summaries:
        ttft, gap = p.ttft_ns, p.gap_ns
        gap_text = "-" if gap is None else _ms(gap.median)
        t.add_row(
            escape(labels.get(p.config_key, p.config_key)),
            f"{p.length:,}",
            _ms(ttft.median) if ttft else "-",
            f"{_ms(ttft.q1)}-{_ms(ttft.q3)}" if ttft else "-",
            f"{_tps(p.prefill_tps_client)} | {_tps(p.prefill_tps_server)}",
            f"{_tps(p.decode_tps_client)} | {_tps(p.decode_tps_server)}",
            f"{p.n_ok}/{p.n_samples}",
            str(p.n_reruns),
            f"[yellow]{gap_text}[/]" if p.gap_is_large else gap_text,
        )
    return t
