"""`xover synth` and `xover inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from xover.console import console, out, progress_bar
from xover.errors import XoverError


def _parse_overrides(items: tuple[str, ...]) -> dict[str, str]:
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise XoverError(f"--set {item!r} is not KEY=VALUE (e.g. --set n_layer=8)")
        overrides[key.strip()] = value.strip()
    return overrides


@click.command()
@click.option("--preset", default="tiny-moe", show_default=True, metavar="NAME",
              help="Shape to write: tiny-moe, qwen3-30b-a3b, dense-30b (see --list).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a shape field, repeatable: --set n_layer=8 --set n_expert=64.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Output .gguf [default: PRESET.gguf].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the random (valid) weights.")
@click.option("--list", "list_presets", is_flag=True, help="List the presets and exit.")
def synth(preset: str, overrides: tuple[str, ...], output: Path | None, seed: int, list_presets: bool) -> None:
    """Write a shape-faithful synthetic GGUF with random but valid quantized weights.

    Speed depends on shapes and types, not on weight values, so a synthetic file lets anyone
    benchmark a 30B MoE without downloading 18 GB. The real llama-bench and llama-server load it;
    its vocabulary accepts text prompts and token-id prompts.
    """
    from xover.gguf import presets as p
    from xover.gguf.synth import write_model

    if list_presets:
        for name, shape in p.PRESETS.items():
            out.print(f"{name:16s} {p.describe(shape)}")
        return
    shape = p.make_shape(preset, **_parse_overrides(overrides))
    path = output or Path(f"{preset}.gguf")
    with progress_bar() as bar:
        task = bar.add_task(f"writing {path.name}", total=None)
        result = write_model(shape, path, seed=seed, progress=lambda done, total: bar.update(task, completed=done, total=total))
    gb = result.bytes / 1e9
    console.print(f"wrote {result.path} ({gb:.2f} GB) in {result.seconds:.1f} s, {gb / max(result.seconds, 1e-9):.2f} GB/s")


@click.command("inspect")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a summary.")
def inspect_cmd(model: Path, as_json: bool) -> None:
    """Shapes, parameters and bytes of any GGUF, and what --n-cpu-moe N moves to the CPU.

    Reads metadata and the tensor table only; tensor data is never loaded.
    """
    from xover.gguf.inspect import inspect_gguf, render_text

    report = inspect_gguf(model)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(render_text(report))
