"""`xover export`: a study's llama-bench results as markdown, CSV or JSONL, from the store alone."""

from __future__ import annotations

from pathlib import Path

import click

from xover.console import console, safe

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


@click.command("export")
@click.argument("study_dir", type=click.Path(path_type=Path))
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(["md", "csv", "jsonl"]),
    default="md",
    show_default=True,
    help="md: llama-bench-style table per model; csv: one row per test; jsonl: every test with raw samples, and failures.",
)
@click.option(
    "--what",
    type=click.Choice(["bench", "ttft", "session"]),
    default="bench",
    show_default=True,
    help="bench: llama-bench tests; ttft: every llama-server sample (cold, warm, cache lab; csv/jsonl); "
    "session: every agentic session turn (csv/jsonl).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="File to write [default: STUDY_DIR/WHAT.FORMAT]; `-` prints to stdout.",
)
def export(study_dir: Path, fmt: str, what: str, output: Path | None) -> None:
    """Re-render a study's results without measuring anything.

    \b
      xover export studies/default                      # llama-bench table, as llama-bench prints it
      xover export studies/default --what ttft -f csv -o -   # raw TTFT samples with server timings
    """
    from xover.report import export as ex

    if output == Path("-"):
        click.echo(ex.render_kind(study_dir, what, fmt), nl=False)
        return
    console.print(f"wrote {safe(ex.write(study_dir, fmt, output, kind=what))}")
