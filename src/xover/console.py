"""Terminal output: one rich console (stderr for progress, so stdout stays parseable)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True, highlight=False)
out = Console(highlight=False, soft_wrap=True)


def progress_bar(description: str = "", transient: bool = False) -> Progress:
    """A progress bar with count and ETA, drawn on stderr."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
    )
