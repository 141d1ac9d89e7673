"""What the server commands (ttft, session, cache) show alike of their runners' progress events."""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.progress import Progress, TaskID

from xover.console import console
from xover.measure.events import ConfigFailed, Note


def failed_or_noted(ev: object, bar: Progress, task: TaskID, where: Callable[[ConfigFailed], str]) -> bool:
    """Show a failed configuration (its planned work counted as done, a red line starting with
    ``where(ev)``) or a note (a yellow line); False for any other event, left to the caller."""
    if isinstance(ev, ConfigFailed):
        bar.update(task, advance=ev.skipped)
        console.print(f"[red]{escape(f'{where(ev)}: {ev.reason}')}[/]")
    elif isinstance(ev, Note):
        console.print(f"[yellow]{escape(ev.text)}[/]")
    else:
        return False
    return True
