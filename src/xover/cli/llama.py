"""`xover llama build|which`."""

from __future__ import annotations

from pathlib import Path

import click

from xover.console import console, progress_bar, safe


@click.group()
def llama() -> None:
    """Build and locate the llama.cpp binaries xover drives."""


@llama.command()
@click.option(
    "--backend",
    type=click.Choice(["cpu", "cuda", "hip", "vulkan", "metal"]),
    default="cpu",
    show_default=True,
    help="ggml backend to build.",
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
    help="llama-cpp-python sdist (.tar.gz) or unpacked llama.cpp tree, for machines without registry access.",
)
@click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=None, help="Parallel compile jobs [default: all cores]."
)
def build(backend: str, cmake_args: tuple[str, ...], source: Path | None, jobs: int | None) -> None:
    """Build llama-bench and llama-server from a pinned llama.cpp (cached per version+backend+flags).

    By default the source is the llama-cpp-python sdist from the package registry, which vendors
    the full llama.cpp tree; it is hash-checked, and nothing else is downloaded at build time.
    A second call with the same key returns at once.
    """
    from xover.llamacpp import build as b

    with progress_bar("compiling", transient=True) as bar:
        task = bar.add_task("llama.cpp", total=None)
        manifest = b.build(
            backend=backend,
            extra_cmake_args=cmake_args,
            source=source,
            jobs=jobs,
            log=lambda s: console.print(f"[dim]{safe(s)}[/]"),
            on_progress=lambda i, n: bar.update(task, completed=i, total=n),
        )
    console.print(f"llama.cpp {manifest.commit[:7]} ({manifest.backend}) ready in {safe(manifest.bin_dir)}")


@llama.command()
@click.option("--llama-bin-dir", type=click.Path(path_type=Path), default=None, help="Use binaries from this folder.")
def which(llama_bin_dir: Path | None) -> None:
    """Print the llama-bench and llama-server xover will use, and where they came from.

    Order: --llama-bin-dir > $XOVER_LLAMA_BIN_DIR > newest cached `xover llama build` > PATH.
    """
    from xover.llamacpp.binaries import resolve

    click.echo(resolve(llama_bin_dir).describe())
