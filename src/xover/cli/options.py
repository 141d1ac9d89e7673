"""Options several commands share, defined once (same spelling, type and help everywhere)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

if TYPE_CHECKING:
    from xover.domain.llama_options import LlamaOption

F = TypeVar("F", bound=Callable[..., Any])


def llama_bin_dir(tools: str = "llama-server") -> Callable[[F], F]:
    """``--llama-bin-dir``: where ``tools`` come from instead of xover's own build."""
    return click.option(
        "--llama-bin-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help=f"Folder with {tools} [default: see `xover llama which`].",
    )


def engine_bin_dirs(tools: str = "llama-bench and llama-server") -> Callable[[F], F]:
    """``--llama-bin-dir [BUILD=]DIR``, once per build: where each build's ``tools`` come from (a bare folder is
    mainline llama.cpp's default build; a build is an engine, a backend, or ENGINE:BACKEND). The value is a dict
    build name -> folder."""
    from xover.errors import XoverError
    from xover.llamacpp.binaries import parse_build_name

    def parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Path]:
        dirs: dict[str, Path] = {}
        for value in values:
            build, sep, folder = value.partition("=")
            if not sep:
                build, folder = "llama.cpp", value
            try:
                parse_build_name(build)
            except XoverError as e:
                raise XoverError(f"--llama-bin-dir {value}: {e}, or a bare DIR") from None
            if build in dirs:
                raise XoverError(f"--llama-bin-dir: {build} is given twice: keep one folder per build")
            dirs[build] = Path(folder)
        return dirs

    return click.option(
        "--llama-bin-dir",
        "llama_bin_dirs",
        metavar="[BUILD=]DIR",
        multiple=True,
        callback=parse,
        help=f"Folder with {tools}, once per build: a bare DIR is mainline llama.cpp's, ik_llama.cpp=DIR "
        "ik_llama.cpp's, vulkan=DIR (or llama.cpp:vulkan=DIR) mainline's Vulkan build, hip=./build-hip/bin your own "
        "HIP build; a [[config]] with backend = '...' runs on its backend's [default: see `xover llama which`].",
    )


def server_timeout(what: str = "/health") -> Callable[[F], F]:
    return click.option(
        "--server-timeout",
        "startup_timeout_s",
        type=click.FloatRange(min=1),
        default=600.0,
        show_default=True,
        help=f"Seconds to wait for {what} to answer 200.",
    )


def vram_budget(scope: str = "run") -> Callable[[F], F]:
    return click.option(
        "--vram-budget",
        metavar="SIZE",
        default=None,
        help="Answer for a smaller card: hold every byte of GPU 0's memory beyond SIZE (e.g. 16GiB) for the whole "
        f"{scope}, so llama.cpp sees a card of that size. Needs a CUDA GPU.",
    )


def taken(params: dict[str, Any], record: type) -> dict[str, Any]:
    """The parameters named like a field of the dataclass ``record``, taken out of ``params``: a command passes
    its options through to the records they fill by name."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(record)}
    return {name: params.pop(name) for name in list(params) if name in names}


def budget(text: str | None) -> int | None:
    """``--vram-budget``'s value in bytes, None when it is not given."""
    from xover.hardware.vram import parse_budget

    return parse_budget(text) if text is not None else None


def server_args() -> Callable[[F], F]:
    return click.argument("server_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- LLAMA-SERVER ARGS]")


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


def int_list(option: str, text: str, minimum: int = 0) -> tuple[int, ...]:
    """``"12,18"`` -> ``(12, 18)``, duplicates dropped; a one-line error naming the option otherwise."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise XoverError(f"{option} {text!r} is not a comma-separated list of integers (e.g. {option} 12,18)") from None
    if any(v < minimum for v in values):
        raise XoverError(f"{option} {text!r}: values must be at least {minimum}")
    return tuple(dict.fromkeys(values))


def choice_list(option: str, text: str, allowed: Sequence[str]) -> tuple[str, ...]:
    """``"on,off"`` -> its values among ``allowed``, duplicates dropped; a one-line error otherwise."""
    values = [v.strip() for v in text.split(",")]
    bad = [v for v in values if v not in allowed]
    if bad:
        raise XoverError(
            f"{option} {text!r}: {bad[0]!r} is not one of {', '.join(allowed)} (e.g. {option} {','.join(allowed[:2])})"
        )
    return tuple(dict.fromkeys(values))


def ints(option: str, values: tuple[str, ...], minimum: int = 0) -> tuple[int, ...]:
    """A repeatable option's whole numbers, () when the option is not given."""
    return int_list(option, _joined(values), minimum) if values else ()


# ---- the option table's sweep options (xover bench, xover ttft) and values to try (xover advise) -----------------


def _dest(option: LlamaOption) -> str:
    return option.name.replace("-", "_").lower()


def table_options(help_prefix: str = "") -> Callable[[F], F]:
    """One repeatable option per swept llama.cpp option of the table (``--ncmoe``, ``--ubatch``, ``-t``...), each
    a comma list, with the table's help; ``help_prefix`` leads each help text."""
    from xover.domain.llama_options import SWEPT

    def wrap(fn: F) -> F:
        for option in reversed(SWEPT):
            metavar = (
                ",".join(option.choices[:2]) + ",..."
                if option.kind == "choice"
                else "0,1"
                if option.kind == "switch"
                else "N,..."
            )
            fn = click.option(
                *option.cli, _dest(option), multiple=True, metavar=metavar, help=help_prefix + option.help
            )(fn)
        return fn

    return wrap


def table_values(kwargs: dict[str, Any]) -> list[tuple[LlamaOption, tuple[str, ...]]]:
    """The values given to :func:`table_options`' options (taken out of ``kwargs``), each checked as the table
    says, in table order; options not given are left out."""
    from xover.domain.llama_options import SWEPT

    out = []
    for option in SWEPT:
        given: tuple[str, ...] = kwargs.pop(_dest(option), ())
        flag = option.cli[-1]
        values = [v.strip() for v in _joined(given).split(",") if v.strip()] if given else []
        parsed = tuple(dict.fromkeys(option.parse(v, flag) for v in values))
        if parsed:
            out.append((option, parsed))
    return out


def env_sweep(help: str) -> Callable[[F], F]:
    """``--env NAME=V[,V...]``: an environment variable to sweep, repeatable."""
    return click.option("--env", "env", multiple=True, metavar="NAME=V[,V...]", help=help)


def parse_env(texts: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``--env`` values (``GGML_OP_OFFLOAD_MIN_BATCH=32,4096``) -> each variable and the values to sweep."""
    import re

    out: list[tuple[str, tuple[str, ...]]] = []
    for text in texts:
        name, sep, values = text.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or not values:
            raise XoverError(
                f"--env {text!r} is not NAME=VALUE[,VALUE...] (e.g. --env GGML_OP_OFFLOAD_MIN_BATCH=32,4096)"
            )
        if name in dict(out):
            raise XoverError("--env names a variable twice: give all its values in one --env NAME=V1,V2")
        out.append((name, tuple(dict.fromkeys(values.split(",")))))
    return tuple(out)


def lengths(default: str | None, help: str = "Prompt lengths in tokens: 1k = 1024, 4096, 32K.") -> Callable[[F], F]:
    """``--lengths L,L,...``: prompt lengths (K = 1024 tokens), read back with
    :func:`xover.domain.prompts.parse_lengths`."""
    shown: dict[str, Any] = {"show_default": True} if default is not None else {}
    return click.option("--lengths", default=default, metavar="L,L,...", help=help, **shown)


# The options the theory models (xover.analysis.theory.offload_of), with the theory's defaults: both sides of op
# offload, the default ubatch and mmapped host weights.
_MODELLED = (("n-cpu-moe", "0"), ("ubatch-size", "512"), ("no-op-offload", "0,1"), ("load-mode", "mmap"))


def modelled_options() -> list[Callable[[F], F]]:
    """``--ncmoe``, ``--ubatch``, ``--no-op-offload``, ``--load-mode`` as the option table defines them, with the
    theory's defaults; read back with :func:`table_values`."""
    from xover.domain.llama_options import BY_NAME

    out: list[Callable[[F], F]] = []
    for name, default in _MODELLED:
        option = BY_NAME[name]
        out.append(
            click.option(
                *option.cli,
                _dest(option),
                multiple=True,
                default=(default,),
                show_default=True,
                metavar="N,..." if option.kind == "int" else ",".join(option.choices[:2]) if option.choices else "0,1",
                help=option.help,
            )
        )
    return out
