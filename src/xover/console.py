"""Terminal output: one rich console (stderr for progress, so stdout stays parseable).

Every string these consoles render (a printed line, a table cell, a title) has its control
characters spelled out first (:func:`xover.untrusted.visible`, newlines and tabs kept), whatever
file or server it came from. Rich's markup cannot be told apart from data that way: a path or a
GGUF string put into a line that uses markup goes through :func:`safe`.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from xover.untrusted import visible


class InertConsole(Console):
    """A rich console that never passes a control character from its input to the terminal."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(text, keep_newlines=True), **kwargs)


def safe(text: object) -> str:
    """An untrusted string (a path, GGUF metadata, a server's answer) for a line that uses rich
    markup: markup escaped, control characters (newlines too) spelled out."""
    return escape(visible(str(text)))


def warn(text: object) -> None:
    """One warning line on stderr; ``text`` is shown as it is (markup escaped, control characters spelled out)."""
    console.print(f"[yellow]warning:[/] {safe(text)}")


def stdout_console(width: int | None = None) -> Console:
    """A console on stdout (a fixed ``width`` for output to a pipe or file)."""
    return InertConsole(file=sys.stdout, width=width, highlight=False, soft_wrap=width is None)


console = InertConsole(stderr=True, highlight=False)
out = InertConsole(highlight=False, soft_wrap=True)


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
