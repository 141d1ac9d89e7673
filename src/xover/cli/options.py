"""Options several commands share, defined once (same spelling, type and help everywhere)."""

from __future__ import annotations

from collections.abc import Callable
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
