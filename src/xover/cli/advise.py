"""`xover advise`: the llama.cpp settings that shrink the prefill penalty, found with few measurements."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from xover.cli import options

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

HELP = """The llama.cpp settings with the lowest expected time per turn, and what they gain over the defaults.

\b
For each --ncmoe level: measure llama.cpp's defaults with llama-bench (pp and tg at the
workload's depths), then each knob's values one at a time with the others at their
defaults; keep each knob's best value when it beats the defaults by more than the noise
(the spread between repetitions); measure the kept values together. The recommendation is
the fastest configuration measured, with the llama-server flags to paste, confirmed with
cold TTFT through llama-server (--no-confirm to skip). TTFT is estimated from llama-bench by
integrating prefill time per token over depth. Each knob's effect on prefill, decode, TTFT
and memory is shown beside what the theory expects; knobs whose effect stays within noise
are named. The result is stored as artifact "advise" in the study's results.sqlite.

\b
xover advise -m qwen3-30b-a3b.gguf --ncmoe 12,18
xover advise -m model.gguf --ncmoe 18 --lengths 8k,16k,32k --knobs lm,ub -r 3
"""


@click.command(help=HELP, context_settings={"show_default": True})
@options.model("The GGUF model.")
@click.option(
    "--workload",
    default="agentic",
    metavar="agentic|FILE",
    help="agentic: prompts uniform over 10K-40K tokens (scaled down to fit the model's training context, "
    "then --budget); FILE: one turn per line, PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]].",
)
@options.lengths(None, "Prompt lengths, uniform (overrides --workload agentic; 4k = 4096).")
@options.response_tokens(200, "Tokens generated per turn.", show_default=None)
@click.option(
    "--knobs",
    "knob_names",
    default=None,
    metavar="NAME,...",
    help="Knobs to search [default: all]: load-mode (lm), ubatch-size (ub), batch-size (b), no-op-offload (nopo), "
    "GGML_OP_OFFLOAD_MIN_BATCH, threads (t).",
)
@options.table_options("Values to try (--ncmoe: the levels, each searched on its own): ")
@click.option(
    "-r",
    "--repetitions",
    type=int,
    default=3,
    help="llama-bench repetitions per test (at least 2: the noise rule needs a spread).",
)
@click.option(
    "--pp",
    "chunk",
    type=int,
    default=None,
    help="Prompt tokens per llama-bench prefill test [default: the largest ubatch tried, at least 512].",
)
@click.option("--tg", "n_gen", type=int, default=64, help="Tokens per llama-bench decode test.")
@click.option(
    "--budget",
    "budget_s",
    default="4m",
    callback=lambda ctx, param, value: _duration(value),
    help="Wall time the whole run may take (240, 240s, 4m, 1h): priced from a first llama-bench process of the "
    "defaults, the plan measures fewer depths, then halves the agentic band, then drops the values the theory "
    "ranks lowest, and says what it left out; a budget too small for the defaults alone is refused.",
)
@click.option(
    "--confirm/--no-confirm", default=True, help="Confirm the winner against the defaults with llama-server cold TTFT."
)
@click.option(
    "--confirm-reps",
    "confirm_repetitions",
    type=click.IntRange(min=1),
    default=2,
    help="Repetitions per length of the server confirmation.",
)
@options.study_dir(
    "Study directory [default: studies/advise-<timestamp>]. Reuse it to reuse measurements.",
    default=None,
    long="--output",
)
@click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds one llama-bench measurement may run.")
@options.vram_budget("run")
@options.llama_bin_dir("llama-bench and llama-server")
def advise(study_dir: Path | None, lengths: str | None, vram_budget: str | None, **params: Any) -> None:
    from xover.analysis.advise import ARTIFACT
    from xover.console import console
    from xover.domain.prompts import parse_lengths
    from xover.measure.advise import AdviseRequest, run_advise_request
    from xover.report.advise import advise_section_markdown
    from xover.untrusted import visible

    study_dir = study_dir or Path("studies") / time.strftime("advise-%Y%m%d-%H%M%S")
    request = AdviseRequest(  # the other options pass through by name, once the values to try are taken out
        study_dir=study_dir,
        lengths=parse_lengths(lengths) if lengths is not None else None,
        values=tuple((o.name, v) for o, v in options.table_values(params)),
        vram_budget=options.budget(vram_budget or None),
        **params,
    )
    advice = run_advise_request(request, command=["xover", *sys.argv[1:]], on_event=_show)
    click.echo(visible(advise_section_markdown(advice), keep_newlines=True), nl=False)  # it quotes the model's path
    console.print(
        f"{advice.measurements} measurements ({advice.reused} reused); advice stored as artifact "
        f"{ARTIFACT!r} in {study_dir / 'results.sqlite'}"
    )


def _duration(value: str | float) -> float:
    from xover.domain.study_spec import parse_duration
    from xover.errors import XoverError

    try:
        seconds = parse_duration(value, "--budget")
    except XoverError as e:
        raise click.BadParameter(str(e).removeprefix("--budget: ")) from None
    if seconds <= 0:
        raise click.BadParameter("must be a positive duration, e.g. 4m")
    return seconds


def _show(event: object) -> None:
    """One event of the search: what it leaves out, each measurement and its estimate, the confirmation."""
    from rich.markup import escape

    from xover.console import console, safe
    from xover.measure.advise import Remark
    from xover.measure.events import ConfigFailed, Measured, Measuring, Note, SampleDone, ServerUp

    if isinstance(event, Remark):
        console.print(safe(event.text))
    elif isinstance(event, ServerUp):
        console.print(f"confirming with llama-server: {escape(event.label)}")
    elif isinstance(event, SampleDone) and event.sample.first_token_ns is not None:
        console.print(f"    L={event.sample.length} cold TTFT {event.sample.first_token_ns / 1e6:,.0f} ms")
    elif isinstance(event, ConfigFailed):
        console.print(f"[red]    {escape(event.label)}: {escape(event.reason)}[/]")
    elif isinstance(event, Note) and event.label is None:  # the confirmation's notes on one point are not shown
        console.print(f"[dim]{escape(event.text)}[/]")
    elif isinstance(event, Measuring):
        of = f"/~{event.planned}" if event.planned else ""  # the plan's estimate: the noise may ask a few more
        eta = f" (about {event.left_s / 60:.1f} min left)" if event.left_s is not None else ""
        console.print(f"[bold]{event.number:>3}{of}[/] {escape(event.label)} ...{eta}")
    elif isinstance(event, Measured):
        e, m = event.estimate, event.measurement
        stored = " (stored)" if m.reused else ""
        if e is None:
            console.print(f"[red]    failed: {escape(m.failure or '')}[/]")
        else:
            console.print(f"    {e.turn_s:.3f} s per turn (TTFT {e.ttft_s:.3f} s, spread {e.spread_s:.3f} s){stored}")
