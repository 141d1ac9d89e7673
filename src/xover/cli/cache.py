"""`xover cache` (the prompt-cache lab) and `xover audit` (re-check stored samples against cache_n/prompt_n)."""

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
    from rich.console import Console

    from xover.analysis.stats import Summary
    from xover.cli.progress import Bar
    from xover.measure.cachelab import LabAnalysis


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@options.model("GGUF model to serve.", required=False)
@options.table_options("llama-server (one value each: the lab runs one configuration): ")
@click.option(
    "--length", default="16k", show_default=True, metavar="L", help="Prompt length in tokens (1k = 1024), at least 1k."
)
@options.study_dir("Study directory: results.sqlite and logs/.")
@options.llama_bin_dir()
@options.server_timeout("each server's /health")
@options.server_args()
def cache(length: str, **params: Any) -> None:
    """Prompt-cache lab: cold vs cached, --cache-reuse after a mid-prompt edit, hidden warm caches.

    Each scenario runs on a freshly started llama-server and every response is checked against
    its cache_n/prompt_n: the same prompt twice (the caching effect on this hardware); an
    original prompt then an edited one with and without --cache-reuse 256; and a prompt sent
    again after others and an erase of every slot, on default settings and on -np 1 --cache-ram 0
    (with the time saving the previous slot adds to the next request). Results go to the study's
    results.sqlite as samples (mode cache:<case>:<request>), which `xover audit` and the report read back.

    \b
    xover cache -m model.gguf --ncmoe 18 --length 16k
    xover cache -m tiny.gguf --length 2k -- -t 1
    """
    from xover.cli.progress import Bar
    from xover.console import console, safe
    from xover.domain.prompts import parse_length
    from xover.measure.cachelab import CacheLabRequest, run_lab

    tokens = parse_length(length)
    # the other options pass through by name, once the swept values are taken out
    request = CacheLabRequest(length=tokens, sweeps=tuple(options.table_values(params)), **params)
    with Bar("cache lab requests") as bar:
        outcome = run_lab(request, command=["xover", *sys.argv[1:]], on_event=lambda ev: _show(ev, bar))
    _print_lab(outcome.analysis, f"prompt cache lab, {outcome.label}, L={tokens:,}")
    console.print(f"[dim]run {outcome.run_id}: {len(outcome.samples)} samples in {safe(request.study_dir)}[/]")
    if outcome.failures:
        raise XoverError(f"{len(outcome.failures)} scenario(s) failed, first: {outcome.failures[0].reason}")


def _show(ev: object, bar: Bar) -> None:
    """One progress event of the lab: the bar, and a line per server started or request failed."""
    from rich.markup import escape

    from xover.cli.progress import failed_or_noted
    from xover.console import console
    from xover.measure.cachelab import LabStarted
    from xover.measure.events import LabRequestDone, ServerUp

    if isinstance(ev, LabStarted):
        bar.start(ev.total)
    elif failed_or_noted(ev, bar, lambda f: f"{f.scenario}"):
        return
    elif isinstance(ev, LabRequestDone):
        bar.completed(ev.done)
        if ev.sample.error is not None:
            console.print(f"[red]{escape(f'{ev.scenario} {ev.sample.mode}: {ev.sample.error}')}[/]")
    elif isinstance(ev, ServerUp):
        console.print(
            f"[dim]{escape(f'{ev.scenario}: llama-server ({ev.settings}) at {ev.url}, log {ev.log_path}')}[/]"
        )


def _stdout() -> Console:
    """The terminal wraps tables to its width; a pipe or file gets them whole."""
    from rich.console import Console

    from xover.console import out

    return out if out.is_terminal else Console(file=sys.stdout, width=200, highlight=False, soft_wrap=True)


def _print_lab(analysis: LabAnalysis, title: str) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from xover.report.cache import lab_table

    header, rows = lab_table(analysis)
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for name in header:
        t.add_column(name, justify="left" if name in ("config", "scenario", "request", "verdict") else "right")
    for row, r in zip(rows, analysis.rows):
        cells = [escape(c) for c in row]
        t.add_row(*cells, style=None if r.ok else "yellow")
    target = _stdout()
    target.print(t)
    for line in analysis.headlines:
        target.print(f"- {escape(line)}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("study_dir", type=click.Path(path_type=Path))
def audit(study_dir: Path) -> int:
    """Re-check every stored TTFT sample of STUDY_DIR against its own cache_n/prompt_n.

    Cold samples must show cache_n == 0 and prompt_n == L, warm ones cache_n == L-1 and
    prompt_n == 1, whatever their stored cache_ok flag says. Lists every measurement labelled cold
    (or warm) that contradicts it, and the median TTFT per configuration and length with and
    without those samples. Exits 1 when it finds any (for CI), 0 otherwise.
    """
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from xover.console import safe
    from xover.measure.audit import audit as run_audit
    from xover.measure.audit import load_samples

    result = run_audit(load_samples(study_dir))
    out = _stdout()
    out.print(
        f"{safe(study_dir)}: {result.n_samples} TTFT samples; {result.n_checked} claim cold or warm and were checked, "
        f"{result.n_unclaimed} lab demonstrations claim neither"
    )
    if result.findings:
        t = Table(
            title="samples whose cache_n/prompt_n contradict their label", box=box.SIMPLE_HEAD, title_justify="left"
        )
        for name in ("row", "run", "config", "mode", "L", "cache_n", "prompt_n", "stored flag", "why"):
            t.add_column(name)
        for f in result.findings:
            st, timings = f.stored, f.stored.sample.timings
            t.add_row(
                str(st.row_id),
                str(st.run_id),
                escape(st.label),
                escape(st.sample.mode),
                f"{st.sample.length:,}",
                str(timings.cache_n if timings else None),
                str(timings.prompt_n if timings else None),
                "[red]ok (counted)[/]" if f.counted else "failed (excluded)",
                escape(f.reason),
            )
        out.print(t)
    if result.summary:
        t = Table(
            title="median TTFT ms per configuration and length: as stored vs without the flagged samples",
            box=box.SIMPLE_HEAD,
            title_justify="left",
        )
        for name in ("config", "mode", "L", "stored (n)", "corrected (n)", "removed"):
            t.add_column(name, justify="left" if name in ("config", "mode") else "right")
        for row in result.summary:
            t.add_row(
                escape(row.label),
                row.mode,
                f"{row.length:,}",
                _median(row.stored),
                _median(row.corrected),
                f"[red]{row.n_removed}[/]" if row.changed else "0",
            )
        out.print(t)
    if not result.findings:
        out.print("no sample contradicts its label")
        return 0
    click.echo(
        f"xover audit: {len(result.findings)} sample(s) labelled cold or warm were cache-assisted, "
        f"{result.n_counted} of them counted as passing",
        err=True,
    )
    return 1


def _median(summary: Summary | None) -> str:
    if summary is None:
        return "—"
    return f"{summary.median / 1e6:,.1f} ({summary.n})"
