"""`xover bench`: llama-bench prefill and decode at depth, swept across offload configurations."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from xover.cli import options
from xover.console import console, safe
from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

if TYPE_CHECKING:
    from xover.cli.progress import Bar

HELP = """Prefill and decode speed at depth (llama-bench), swept across offload configurations.

\b
At every depth N two tests are measured:
  pp512 @ dN  the speed of 512 NEW prompt tokens on top of N tokens already in the
              KV cache. The depth prefill itself is not timed: llama-bench computes it
              once, saves the KV state and restores it for later repetitions. This is
              an agent's next turn on top of its conversation history.
  tg128 @ dN  decode speed (one token at a time) with N tokens in the cache. Decode
              reads the whole KV cache for every token, so it slows with depth too;
              measuring it at each depth is what lets prefill loss be weighed against
              decode gain at the context lengths you actually use.

\b
A configuration is one combination of the swept values (--ncmoe x --load-mode x
--ubatch x --batch x ... x each --env); each
runs as its own llama-bench process, so one that does not fit, crashes or times out
is stored as failed and the sweep goes on. Every test is stored the moment it
finishes, and each configuration's peak memory (VmHWM and the buffers llama.cpp
logs) beside it. Rerun the same command with the same -o to resume: measured tests
are skipped, failed configurations retried. Ctrl-C keeps everything already measured.

\b
Knobs worth sweeping with --ncmoe:
  --no-op-offload 0,1   with op offload (0, default) the GPU runs prefill batches of
                        CPU-resident experts, copying them over PCIe each ubatch
  --ubatch 512,2048     more tokens per copy amortise that transfer
  --load-mode none,mmap none: weights in pinned host memory, copied faster than
                        mmapped (pageable) pages
  --env GGML_OP_OFFLOAD_MIN_BATCH=32,4096
                        smallest batch the GPU takes over (CUDA; default 32)
Anything after `--` goes to llama-bench unchanged (e.g. -- -ngl 99).

\b
Example (module 6.3):
  xover bench -m qwen3-30b-a3b.gguf --ncmoe 12,18 --depth 1000,4000,16000,32000 -t 8
"""


class ConfigurationsFailed(XoverError):
    """Some configurations could not be measured; everything else was stored."""

    exit_code = 1


def _show(event: object, bar: Bar) -> None:
    """Draws sweep events: one bar over all tests (only when something runs), a line per stored
    test or failed configuration."""
    from xover.measure import events as b

    if isinstance(event, b.Note):  # the VRAM budget held
        console.print(f"[dim]{safe(event.text)}[/]")
    elif isinstance(event, b.SweepPlanned):
        for config in event.plan.skipped:
            console.print(
                f"[dim]skip {safe(config.label)}: every test already in {safe(event.study_dir)} (--fresh to remeasure)[/]"
            )
        if event.plan.jobs:
            bar.start(event.plan.total_tests)
    elif not bar.started:
        return
    elif isinstance(event, b.ConfigStarted):
        bar.describe(f"{event.job.config.label} ({event.index + 1}/{event.count})")
    elif isinstance(event, b.Progressed):
        bar.completed(event.completed)
    elif isinstance(event, b.ResultStored):
        r = event.result
        console.print(f"  {safe(event.config.label):<24} {r.test_name:<18} {r.avg_ts:>10.2f} ± {r.stddev_ts:.2f} t/s")
    elif isinstance(event, b.ConfigFailed):
        console.print(f"[red]  {safe(event.label)} failed: {safe(event.reason)}[/]")


@click.command(help=HELP, context_settings={"show_default": True})
@options.model("The GGUF model to benchmark.", dir_okay=True)
@click.option(
    "--depth",
    default="1000,4000,16000,32000",
    metavar="N,...",
    help="Context depths: tokens already in the KV cache before each test.",
)
@click.option("--pp", "n_prompt", type=int, default=512, help="Prefill test size in tokens (0: no prefill tests).")
@click.option("--tg", "n_gen", type=int, default=128, help="Decode test size in tokens (0: no decode tests).")
@options.table_options("To sweep: ")
@options.env_sweep("Environment variable to sweep, repeatable, e.g. --env GGML_OP_OFFLOAD_MIN_BATCH=32,4096.")
@click.option("-r", "--repetitions", type=int, default=5, help="Repetitions per test (llama-bench -r).")
@options.study_dir(
    "Study directory holding results.sqlite [default: studies/bench-<timestamp>]. Reuse it to resume.",
    default=None,
    long="--output",
    file_okay=True,
)
@click.option("--fresh", is_flag=True, help="Measure every test again, even those already in the study.")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=None,
    help="Seconds one configuration may run before it is stopped and stored as failed.",
)
@click.option(
    "--llama-bin-dir", type=click.Path(path_type=Path), default=None, help="Use llama-bench from this folder."
)
@options.vram_budget("run")
@click.argument("bench_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA_BENCH_ARGS...]")
def bench(depth: str, env: tuple[str, ...], study_dir: Path | None, vram_budget: str | None, **params: Any) -> None:
    from xover.cli.progress import Bar
    from xover.measure.bench import BenchRequest, BenchTests, run_bench
    from xover.report import export

    tests = BenchTests(depths=options.int_list("--depth", depth), **options.taken(params, BenchTests))
    study_dir = study_dir or Path("studies") / time.strftime("bench-%Y%m%d-%H%M%S")
    request = BenchRequest(  # the other options pass through by name, once the swept values are taken out
        tests=tests,
        study_dir=study_dir,
        sweeps=tuple(options.table_values(params)),
        env=options.parse_env(env),
        vram_budget=options.budget(vram_budget or None),
        **params,
    )
    with Bar("llama-bench") as bar:
        run = run_bench(request, command=sys.argv, on_event=lambda event: _show(event, bar))
    outcome = run.outcome
    click.echo(export.render_markdown(run.data), nl=False)
    for label, memory in run.memory:
        click.echo(f"memory {label}: {memory}")
    console.print(
        f"{outcome.stored} tests stored in {outcome.store_path}"
        + (f"; {len(outcome.skipped)} configurations already measured" if outcome.skipped else "")
        + f"\nexport: xover export {study_dir} --format md|csv|jsonl"
    )
    if outcome.failures:
        raise ConfigurationsFailed(
            f"{len(outcome.failures)} of {len(outcome.configs) - len(outcome.skipped)} configurations failed "
            "(stored with their stderr; rerun the same command to retry them)"
        )
