"""`xover llama build|which`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xover.console import console, progress_bar, safe
from xover.domain.llama_options import BACKENDS, ENGINES

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


@click.group()
def llama() -> None:
    """Build and locate the llama.cpp binaries xover drives."""


def _engine_option(default: str | None, help: str) -> Any:
    return click.option("--engine", type=click.Choice(ENGINES), default=default, show_default=bool(default), help=help)


@llama.command()
@_engine_option(
    "llama.cpp",
    "Which llama.cpp: mainline llama.cpp, or ik_llama.cpp (its fused MoE, run-time repacking and offload of active "
    "experts only).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="cpu",
    show_default=True,
    help="ggml backend to build (a build is engine + backend; each is cached beside the others, and a [[config]] "
    "with backend = '...' runs on it). vulkan needs glslc, libvulkan-dev and spirv-headers (Debian's packages); hip "
    "needs ROCm (hipcc, hipBLAS, rocBLAS; pass --cmake-arg=-DGPU_TARGETS=gfx1100 for your card).",
)
@click.option(
    "--cmake-arg",
    "cmake_args",
    multiple=True,
    metavar="ARG",
    help="Extra cmake argument, repeatable, e.g. --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90.",
)
@click.option(
    "--source",
    type=click.Path(path_type=Path),
    default=None,
    help="The engine's sdist (.tar.gz: llama-cpp-python, ik-llama-cpp-python) or an unpacked source tree, for "
    "machines without registry access.",
)
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel compile jobs [default: all cores]."
)
def build(engine: str, backend: str, cmake_args: tuple[str, ...], source: Path | None, jobs: int | None) -> None:
    """Build llama-bench and llama-server from a pinned llama.cpp (cached per engine+version+backend+flags).

    By default the source is the engine's sdist from the package registry, which vendors its whole tree
    (llama.cpp: llama-cpp-python; ik_llama.cpp: ik-llama-cpp-python); it is hash-checked, and nothing else is
    downloaded at build time. A second call with the same key returns at once.

    \b
      xover llama build                          # mainline llama.cpp for the CPU
      xover llama build --backend cuda --cmake-arg=-DCMAKE_CUDA_ARCHITECTURES=90
      xover llama build --engine ik_llama.cpp    # ik_llama.cpp beside it, for [[config]] engine = "ik_llama.cpp"
      xover llama build --backend vulkan         # mainline's Vulkan build, for [[config]] backend = "vulkan"
    """
    from xover.llamacpp import build as b

    with progress_bar("compiling", transient=True) as bar:
        task = bar.add_task(engine, total=None)
        manifest = b.build(
            backend=backend,
            extra_cmake_args=cmake_args,
            source=source,
            jobs=jobs,
            log=lambda s: console.print(f"[dim]{safe(s)}[/]"),
            on_progress=lambda i, n: bar.update(task, completed=i, total=n),
            engine=engine,
        )
    console.print(f"{engine} {manifest.commit[:7]} ({manifest.backend}) ready in {safe(manifest.bin_dir)}")


@llama.command()
@click.option("--llama-bin-dir", type=click.Path(path_type=Path), default=None, help="Use binaries from this folder.")
@_engine_option(None, "Only this engine [default: every engine, each with its own binaries].")
def which(llama_bin_dir: Path | None, engine: str | None) -> None:
    """Print the llama-bench and llama-server xover will use for each engine, and where they came from.

    Order, per engine: --llama-bin-dir (with --engine, or mainline's) > its variable ($XOVER_LLAMA_BIN_DIR,
    $XOVER_IK_LLAMA_BIN_DIR) > its newest cached `xover llama build --engine` > PATH (mainline only).
    """
    from xover.domain.llama_options import ENGINE, ENGINES
    from xover.errors import XoverError
    from xover.llamacpp.binaries import resolve
    from xover.llamacpp.build import cached_builds

    for name in (engine,) if engine is not None else ENGINES:
        given = llama_bin_dir if name == (engine or ENGINE) else None
        click.echo(f"[{name}]")
        try:
            click.echo(resolve(given, name).describe())
        except XoverError as e:
            if engine is not None or name == ENGINE:
                raise
            click.echo(f"not built: {e}")
    builds = [m for m in cached_builds(engine=None) if engine is None or m.engine == engine]
    if builds:
        click.echo("\nxover's builds (a [[config]] names one by engine and backend):")
        for m in builds:
            click.echo(f"  {m.engine:<13} {m.backend:<7} {m.commit[:7]}  {m.bin_dir}")
