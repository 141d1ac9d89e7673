"""`xover advise`: the llama.cpp settings that shrink the prefill penalty, found with few measurements."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from xover.cli import options
from xover.errors import XoverError

if TYPE_CHECKING:
    from rich.console import Console

    from xover.analysis.advise import Knob, Workload


@click.command(context_settings={"show_default": True})
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
    type=float,
    default=120.0,
    help="Seconds one measurement may take: the agentic workload is scaled down to fit.",
)
@click.option(
    "--confirm/--no-confirm", default=True, help="Confirm the winner against the defaults with llama-server cold TTFT."
)
@click.option(
    "--confirm-reps", type=click.IntRange(min=1), default=2, help="Repetitions per length of the server confirmation."
)
@options.study_dir(
    "Study directory [default: studies/advise-<timestamp>]. Reuse it to reuse measurements.",
    default=None,
    long="--output",
)
@click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds one llama-bench measurement may run.")
@options.vram_budget("run")
@options.llama_bin_dir("llama-bench and llama-server")
def advise(
    model: Path,
    workload: str,
    lengths: str | None,
    response_tokens: int,
    knob_names: str | None,
    repetitions: int,
    chunk: int | None,
    n_gen: int,
    budget_s: float,
    confirm: bool,
    confirm_reps: int,
    study_dir: Path | None,
    timeout_s: float | None,
    vram_budget: str | None,
    llama_bin_dir: Path | None,
    **swept: tuple[str, ...],
) -> None:
    """The llama.cpp settings with the lowest expected time per turn, and what they gain over the defaults.

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
    from xover.analysis import advise as adv
    from xover.console import console
    from xover.llamacpp.binaries import resolve
    from xover.measure.advise import AdviseSpec, run_advise
    from xover.measure.events import ConfigFailed, Measured, Measuring, Note, SampleDone, ServerUp
    from xover.report.advise import advise_section_markdown
    from xover.untrusted import visible

    given = dict((o.name, v) for o, v in options.table_values(swept))
    levels = tuple(int(v) for v in given.pop("n-cpu-moe", ())) or (None,)
    knobs = adv.default_knobs(os.cpu_count() or 1)
    for name, values in given.items():
        knobs = adv.with_values_to_try(knobs, name, values)
    if knob_names is not None:
        wanted = [n.strip() for n in knob_names.split(",") if n.strip()]
        known = {k.name: k for k in knobs} | {k.short: k for k in knobs}
        bad = [n for n in wanted if n not in known]
        if bad or not wanted:
            raise XoverError(
                f"--knobs {knob_names!r}: choose from {', '.join(k.name for k in knobs)} (or lm, ub, b, nopo, t)"
            )
        names = {known[n].name for n in wanted}
        knobs = tuple(k for k in knobs if k.name in names)

    binaries = resolve(llama_bin_dir)
    backend = binaries.manifest.backend if binaries.manifest is not None else None
    dropped: list[Knob] = []
    if backend == "cpu" and knob_names is None:
        # pinned memory, op offload and its threshold only change how weights reach a GPU: nothing to copy here
        dropped = [k for k in knobs if k.gpu_only and k.name not in given]
        knobs = tuple(k for k in knobs if k not in dropped)

    from xover.gguf.inspect import model_context

    if not model.is_file():
        raise XoverError(f"model {model} does not exist: pass -m PATH to a .gguf file")
    context = model_context(model)
    if "ubatch-size" not in given and context.n_ctx_train:
        knobs = _ubatches_that_fit(knobs, context.n_ctx_train, context.name, console)

    response = response_tokens
    if lengths is not None:
        if workload != "agentic":
            raise XoverError("give either --lengths or --workload FILE, not both")
        from xover.domain.prompts import parse_lengths

        the_workload: adv.Workload | None = adv.uniform_workload(parse_lengths(lengths), response)
    elif workload == "agentic":
        the_workload = None
    else:
        path = Path(workload)
        try:
            text = path.read_text()
        except OSError as e:
            raise XoverError(
                f"--workload {workload}: cannot read it ({e.strerror or e}); give agentic or a file of turns"
            ) from None
        the_workload = adv.parse_workload(text, response, path.name)

    if the_workload is not None:
        _check_context(model, levels, the_workload, knobs, chunk, n_gen, "--lengths" if lengths else "--workload")
    spec = AdviseSpec(
        model=model,
        knobs=knobs,
        ncmoe=levels,
        workload=the_workload,
        response_tokens=response,
        repetitions=repetitions,
        n_gen=n_gen,
        chunk=chunk,
        budget_s=budget_s,
        confirm=confirm,
        confirm_repetitions=confirm_reps,
        timeout_s=timeout_s,
    )
    study_dir = study_dir or Path("studies") / time.strftime("advise-%Y%m%d-%H%M%S")
    if dropped:  # said once every input is known to be good, so a bad one still gets a one-line error
        from rich.markup import escape

        console.print(
            escape(
                f"{', '.join(k.name for k in dropped)} left out: this llama.cpp build is CPU-only and "
                "they only change how weights reach a GPU (name them with --knobs to search them)"
            )
        )

    def on_event(event: object) -> None:
        from rich.markup import escape

        if isinstance(event, ServerUp):
            console.print(f"confirming with llama-server: {escape(event.label)}")
        elif isinstance(event, SampleDone) and event.sample.first_token_ns is not None:
            console.print(f"    L={event.sample.length} cold TTFT {event.sample.first_token_ns / 1e6:,.0f} ms")
        elif isinstance(event, ConfigFailed):
            console.print(f"[red]    {escape(event.label)}: {escape(event.reason)}[/]")
        elif isinstance(event, Note) and event.label is None:  # the confirmation's notes on one point are not shown
            console.print(f"[dim]{escape(event.text)}[/]")
        elif isinstance(event, Measuring):
            console.print(f"[bold]{event.number:>3}[/] {escape(event.label)} ...")
        elif isinstance(event, Measured):
            e, m = event.estimate, event.measurement
            stored = " (stored)" if m.reused else ""
            if e is None:
                console.print(f"[red]    failed: {escape(m.failure or '')}[/]")
            else:
                console.print(
                    f"    {e.turn_s:.3f} s per turn (TTFT {e.ttft_s:.3f} s, spread {e.spread_s:.3f} s){stored}"
                )

    from xover.console import safe
    from xover.hardware.vram import holding, parse_budget

    with holding(parse_budget(vram_budget) if vram_budget else None) as hold:
        if hold is not None:
            console.print(safe(hold.describe()))
        advice = run_advise(spec, binaries, study_dir, command=["xover", *sys.argv[1:]], on_event=on_event)
    click.echo(visible(advise_section_markdown(advice), keep_newlines=True), nl=False)  # it quotes the model's path
    console.print(
        f"{advice.measurements} measurements ({advice.reused} reused); advice stored as artifact "
        f"{adv.ARTIFACT!r} in {study_dir / 'results.sqlite'}"
    )


def _ubatches_that_fit(knobs: tuple[Knob, ...], n_ctx: int, name: str, console: Console) -> tuple[Knob, ...]:
    """The default -ub candidates without those above half the training context: the largest one tried
    is the prefill test's size, and the depths of the workload need the other half."""
    from rich.markup import escape

    from xover.analysis import advise as adv

    knob = next((k for k in knobs if k.name == "ubatch-size"), None)
    if knob is None:
        return knobs
    keep = [v for v in knob.candidates if int(v) <= n_ctx // 2]
    if len(keep) == len(knob.candidates):
        return knobs
    dropped = [v for v in knob.candidates if v not in keep]
    console.print(
        escape(
            f"-ub {','.join(dropped)} left out: more than half of {name}'s training context of "
            f"{n_ctx:,} tokens (--ubatch to choose)"
        )
    )
    if not keep:
        return tuple(k for k in knobs if k.name != "ubatch-size")
    return adv.with_candidates(knobs, "ubatch-size", keep)


def _check_context(
    model: Path,
    levels: tuple[int | None, ...],
    workload: Workload,
    knobs: tuple[Knob, ...],
    chunk: int | None,
    n_gen: int,
    option: str,
) -> None:
    """Fail before measuring when a given workload's prompts, as llama-bench depths with the prefill and
    decode tests on top, exceed the model's training context; the message names the lengths that fit."""
    from xover.analysis import advise as adv
    from xover.gguf.inspect import check_offload_and_context

    ubatches = [int(v) for k in knobs if k.name == "ubatch-size" for v in k.candidates]
    pp = chunk or max([adv.LLAMA_DEFAULT_UBATCH, *ubatches])
    check_offload_and_context(
        model,
        [n for n in levels if n is not None],
        lengths=workload.lengths,
        extra_tokens=pp + n_gen,
        option=option,
        extra_what=f"llama-bench test tokens (pp{pp} + tg{n_gen})",
    )
