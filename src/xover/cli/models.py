"""`xover synth` and `xover inspect`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from xover.console import console, out, progress_bar, safe
from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


def _parse_overrides(items: tuple[str, ...]) -> dict[str, object]:
    """``KEY=VALUE`` strings -> typed shape overrides (ints, floats, names; ``types.ROLE=Q8_0`` retypes a role)."""
    import dataclasses

    from xover.domain.shapes import ModelShape

    kinds = {f.name: str(f.type) for f in dataclasses.fields(ModelShape)}
    overrides: dict[str, object] = {}
    types: dict[str, str] = {}
    for item in items:
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or not key or not value:
            raise XoverError(f"--set {item!r} is not KEY=VALUE (e.g. --set n_layer=8 or --set types.attn_v=Q8_0)")
        if key.startswith("types."):
            types[key[len("types.") :]] = value
            continue
        kind = kinds.get(key)
        if kind is None:
            raise XoverError(
                f"--set {key}: unknown shape field; choose from {', '.join(k for k in kinds if k != 'types')}"
            )
        if kind == "bool":
            if value.lower() not in ("true", "false", "1", "0"):
                raise XoverError(f"--set {item!r}: {key} takes true or false")
            overrides[key] = value.lower() in ("true", "1")
            continue
        try:
            overrides[key] = int(value) if kind == "int" else float(value) if kind == "float" else value
        except ValueError:
            raise XoverError(f"--set {item!r}: {key} takes a{'n integer' if kind == 'int' else ' number'}") from None
    if types:
        overrides["types"] = types
    return overrides


@click.command()
@click.option(
    "--preset",
    default="tiny-moe",
    show_default=True,
    metavar="NAME",
    help="Shape to write: tiny-moe, qwen3-30b-a3b, dense-30b, gpt-oss-20b, gpt-oss-120b, glm-4.5-air, "
    "deepseek-v2-lite, tiny-gpt-oss, tiny-glm4moe, tiny-deepseek2 (see --list).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a shape field, repeatable: --set n_layer=8 --set n_expert=64.",
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path), default=None, help="Output .gguf [default: PRESET.gguf]."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for the random (valid) weights.")
@click.option("--list", "list_presets", is_flag=True, help="List the presets and exit.")
def synth(preset: str, overrides: tuple[str, ...], output: Path | None, seed: int, list_presets: bool) -> None:
    """Write a shape-faithful synthetic GGUF with random but valid quantized weights.

    Speed depends on shapes and types, not on weight values, so a synthetic file lets anyone
    benchmark a 30B MoE without downloading 18 GB. The real llama-bench and llama-server load it;
    its vocabulary accepts text prompts and token-id prompts.
    """
    from xover.domain import presets as p
    from xover.gguf.synth import write_model

    if list_presets:
        from xover.domain.shapes import expert_params, tensor_table, total_bytes, total_params
        from xover.gguf.inspect import format_bytes, format_params

        for name, shape in p.ALL_PRESETS.items():
            table = tensor_table(shape)
            kind = f"{shape.n_expert} experts ({shape.n_expert_used} used)" if shape.is_moe else "dense"
            out.print(
                f"{name:16s} {shape.arch:9s} {shape.n_layer:3d} layers, n_embd {shape.n_embd}, {kind}; "
                f"{format_params(total_params(table))} params ({format_params(expert_params(table))} in experts), "
                f"{format_bytes(total_bytes(table))}"
            )
        return
    shape = p.make_shape(preset, **_parse_overrides(overrides))
    path = output or Path(f"{preset}.gguf")
    with progress_bar() as bar:
        task = bar.add_task(f"writing {safe(path.name)}", total=None)
        result = write_model(
            shape, path, seed=seed, progress=lambda done, total: bar.update(task, completed=done, total=total)
        )
    from xover.gguf.inspect import format_bytes

    rate = result.bytes / 1e9 / max(result.seconds, 1e-9)
    console.print(
        f"wrote {safe(result.path)} ({format_bytes(result.bytes)}) in {result.seconds:.1f} s, {rate:.2f} GB/s"
    )


@click.command("inspect")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a summary.")
def inspect_cmd(model: Path, as_json: bool) -> None:
    """Shapes, parameters and bytes of any GGUF, and what --n-cpu-moe N moves to the CPU.

    Reads metadata and the tensor table only; tensor data is never loaded. Strings from the file
    (its name, architecture) and the path are printed as they are, with control characters spelled
    out (an escape sequence in general.name shows as \x1b[...); --json keeps them exact, JSON-escaped.
    """
    from xover.gguf.inspect import inspect_gguf, render_text

    report = inspect_gguf(model)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        out.print(render_text(report), markup=False)  # every string in it is data; control characters spelled out
