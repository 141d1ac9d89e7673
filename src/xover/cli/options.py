"""Options several commands share, defined once (same spelling, type and help everywhere)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def llama_bin_dir(tools: str = "llama-server") -> Callable[[F], F]:
    """``--llama-bin-dir``: where ``tools`` come from instead of xover's own build."""
    return click.option(
        "--llama-bin-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help=f"Folder with {tools} [default: see `xover llama which`].",
    )


def server_timeout(what: str = "/health") -> Callable[[F], F]:
    return click.option(
        "--server-timeout",
        type=click.FloatRange(min=1),
        default=600.0,
        show_default=True,
        help=f"Seconds to wait for {what} to answer 200.",
    )


def vram_budget(scope: str = "run") -> Callable[[F], F]:
    return click.option(
        "--vram-budget",
        "vram_budget",
        metavar="SIZE",
        default=None,
        help="Answer for a smaller card: hold every byte of GPU 0's memory beyond SIZE (e.g. 16GiB) for the whole "
        f"{scope}, so llama.cpp sees a card of that size. Needs a CUDA GPU.",
    )


def server_args() -> Callable[[F], F]:
    return click.argument("extra_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA-SERVER ARGS]")


def model(help: str, *, required: bool = True, dir_okay: bool = False) -> Callable[[F], F]:
    """``-m/--model``: the GGUF file (None when an optional one is not given)."""
    presence: dict[str, Any] = {"required": True} if required else {"default": None}
    return click.option("-m", "--model", type=click.Path(path_type=Path, dir_okay=dir_okay), help=help, **presence)


def study_dir(
    help: str, *, default: Path | None = Path("xover-study"), long: str = "--out", file_okay: bool = False
) -> Callable[[F], F]:
    """``-o/--out`` (or ``-o/<long>``): the study directory (its results.sqlite and logs/); a default is shown
    in the help, None leaves the command to pick one."""
    shown: dict[str, Any] = {} if default is None else {"show_default": True}
    return click.option(
        "-o",
        long,
        "study_dir",
        type=click.Path(path_type=Path, file_okay=file_okay),
        default=default,
        help=help,
        **shown,
    )


def at_least(minimum: int, *decls: str, default: int, help: str, show_default: bool | None = True) -> Callable[[F], F]:
    """A whole number of at least ``minimum``."""
    return click.option(*decls, type=click.IntRange(min=minimum), default=default, show_default=show_default, help=help)


def response_tokens(default: int, help: str, *, show_default: bool | None = True) -> Callable[[F], F]:
    """``-R/--response-tokens``: tokens generated per request or turn."""
    return at_least(1, "-R", "--response-tokens", default=default, help=help, show_default=show_default)


def sweep(*decls: str, metavar: str = "N,...", help: str) -> Callable[[F], F]:
    """A knob's values: repeatable, each a comma list, read back with :func:`ints` or :func:`choices`."""
    return click.option(*decls, multiple=True, metavar=metavar, help=help)


def _joined(values: tuple[str, ...]) -> str:
    """Repeated options join like llama-bench's: `--ubatch 512 --ubatch 2048` == `--ubatch 512,2048`."""
    return ",".join(values)


def ints(option: str, values: tuple[str, ...], minimum: int = 0) -> tuple[int, ...]:
    """A swept knob's whole numbers, () when the option is not given."""
    from xover.measure.bench import parse_int_list

    return parse_int_list(option, _joined(values), minimum) if values else ()


def choices(option: str, values: tuple[str, ...], allowed: Sequence[str]) -> tuple[str, ...]:
    """A swept knob's values among ``allowed``, () when the option is not given."""
    from xover.measure.bench import parse_choice_list

    return parse_choice_list(option, _joined(values), allowed) if values else ()
