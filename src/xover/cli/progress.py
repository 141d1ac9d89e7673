"""What the commands that measure (bench, ttft, session, cache) show alike of their runners' progress events."""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape
from rich.progress import Progress, TaskID

from xover.console import console, progress_bar
from xover.measure.events import ConfigFailed, Note


class Bar:
    """One progress bar, drawn from the moment the run says how much work it plans (:meth:`start`) until the
    command's ``with`` block ends, whichever way it ends."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.total = 0

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    @property
    def started(self) -> bool:
        return self.progress is not None

    def start(self, total: int) -> None:
        self.total = total
        self.progress = progress_bar()
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=total)

    def advance(self, n: int = 1) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, advance=n)

    def completed(self, n: float) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, completed=n)

    def describe(self, text: str) -> None:
        """What the bar is working on from now on (llama-bench: the configuration running)."""
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, description=text)

    def grow(self, n: int = 1) -> None:
        """``n`` more units of work than planned (a re-run)."""
        self.total += n
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, total=self.total)


def failed_or_noted(ev: object, bar: Bar, where: Callable[[ConfigFailed], str]) -> bool:
    """Show a failed configuration (its planned work counted as done, a red line starting with
    ``where(ev)``) or a note (a yellow line); False for any other event, left to the caller."""
    if isinstance(ev, ConfigFailed):
        bar.advance(ev.skipped)
        console.print(f"[red]{escape(f'{where(ev)}: {ev.reason}')}[/]")
    elif isinstance(ev, Note):
        console.print(f"[yellow]{escape(ev.text)}[/]")
    else:
        return False
    return True
