"""`xover theory` and `xover predict`: the roofline theory of a model on a machine, before measuring."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table

from xover.cli import options
from xover.console import console, out, safe
from xover.domain.units import format_tokens
from xover.errors import XoverError

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

F = TypeVar("F", bound=Callable[..., Any])


# The options `theory` and `predict` share, in their help's order: the model and the machine, then the modelled
# llama.cpp options (cli.options.modelled_options), then the sizes and the budget, then the output.
_MODEL_OPTIONS = (
    click.option(
        "-m",
        "--model",
        "model",
        metavar="FILE|preset:NAME",
        default=None,
        help="A GGUF file, or preset:NAME for a built-in shape (no file needed).",
    ),
    click.option("--preset", default=None, metavar="NAME", help="Same as -m preset:NAME (tiny-moe, qwen3-30b-a3b...)."),
    click.option(
        "--hw",
        "hw_spec",
        default=None,
        metavar="NAME|FILE.toml",
        help="Hardware profile (h200, rtx-4090, cpu...; xover theory --list-hw) or a TOML file of "
        "overrides [default: detect this machine].",
    ),
    click.option(
        "--measure",
        is_flag=True,
        help="Measure this CPU's FLOP/s and bandwidth and, with a CUDA GPU, its host-to-device rates (about 4 s).",
    ),
)
_SIZE_OPTIONS = (
    options.lengths("1k,4k,16k,32k"),
    click.option(
        "-R",
        "--response-tokens",
        "--response",
        "response",
        type=int,
        default=200,
        show_default=True,
        help="Response tokens R in total time = TTFT + R decode steps (--response is the old spelling).",
    ),
    click.option(
        "--pp",
        "pp_tokens",
        type=int,
        default=512,
        show_default=True,
        help="New tokens of the pp @ depth prediction (llama-bench -p).",
    ),
    click.option("--ctk", "cache_type", default="F16", show_default=True, help="KV cache type (F16, Q8_0)."),
    click.option(
        "--vram",
        default=None,
        metavar="BYTES",
        help="VRAM budget for the placement plan (16GiB) [default: free VRAM nvidia-smi reports, if any].",
    ),
    click.option(
        "--headroom",
        default="1GiB",
        show_default=True,
        metavar="BYTES",
        help="VRAM kept free beyond the estimated buffers: the CUDA context (about 0.5 GiB) and what llama.cpp "
        "allocates at the first request (cuBLAS workspace, CUDA pool); 512 MiB crashed an H200 run under a 16 GiB "
        "budget.",
    ),
)
_JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")


def _options(study_required: bool) -> Callable[[F], F]:
    """The options `theory` and `predict` share (``-o`` is required by `predict`)."""
    # no explicit default where it is required: click 8.2+ takes `default=None` as a value given, and skips the check
    study = click.option(
        "-o",
        "--output",
        "study_dir",
        type=click.Path(path_type=Path),
        help="Study directory to store the result in.",
        **({"required": True} if study_required else {"default": None}),
    )

    def wrap(fn: F) -> F:
        for decorator in reversed((*_MODEL_OPTIONS, *options.modelled_options(), *_SIZE_OPTIONS, study, _JSON_OPTION)):
            fn = decorator(fn)
        return fn

    return wrap


def _inputs(
    model: str | None,
    preset: str | None,
    hw_spec: str | None,
    measure: bool,
    lengths: str,
    cache_type: str,
    vram: str | None,
    headroom: str,
    **modelled: tuple[str, ...],
) -> dict[str, Any]:
    """Options -> model terms, hardware, configurations, lengths, budget (one call each into the library)."""
    from xover.analysis.theory import model_terms, offload_of
    from xover.domain.config import matrix
    from xover.domain.profiles import parse_bytes
    from xover.domain.prompts import parse_lengths
    from xover.hardware.detect import resolve

    table, model_info = _load_model(model, preset)
    terms = model_terms(table, cache_type)
    with console.status("measuring the CPU" if measure else "detecting hardware"):
        hw, detected = resolve(hw_spec, measure)
    configs = tuple(offload_of(c) for c in matrix(options.table_values(modelled)))
    budget = parse_bytes(vram) if vram else detected.free_bytes if detected and hw_spec is None else None
    return {
        "terms": terms,
        "hw": hw,
        "configs": configs,
        "lengths": parse_lengths(lengths),
        "model": model_info,
        "vram_budget_bytes": budget,
        "headroom_bytes": parse_bytes(headroom),
    }


def _load_model(model: str | None, preset: str | None) -> tuple[Any, dict[str, Any]]:
    from xover.domain.presets import preset as get_preset
    from xover.domain.shapes import tensor_table, total_bytes

    if model and preset:
        raise XoverError("give either -m or --preset, not both")
    name = preset or (model[len("preset:") :] if model and model.startswith("preset:") else None)
    if name:
        table = tensor_table(get_preset(name))
        return table, {"name": name, "source": f"preset:{name}", "total_bytes": total_bytes(table)}
    if not model:
        raise XoverError("no model: give -m FILE.gguf or -m preset:qwen3-30b-a3b")
    from xover.gguf.inspect import model_table

    table, name = model_table(model)
    return table, {"name": name, "source": model, "total_bytes": total_bytes(table)}


def _now() -> tuple[str, int]:
    from xover.results.store import now_iso

    return now_iso(), time.time_ns()


# --------------------------------------------------------------------------------------------------
# rendering


def _b(n: float | None) -> str:
    from xover.gguf.inspect import format_bytes

    return "-" if n is None else format_bytes(n)


def _si(n: float, unit: str = "") -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}"
    return f"{n:.3g} {unit}".rstrip()


_k = format_tokens


def _time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def render_hardware(hw: dict[str, Any]) -> Table:
    t = Table(title=f"Hardware: {hw['name']}", title_justify="left")
    for col in ("part", "field", "value", "source"):
        t.add_column(col)
    sources = hw["sources"]
    for part in ("gpu", "cpu"):
        spec = hw[part]
        if spec is None:
            t.add_row(part, "-", "none: CPU-only", sources.get(part, "built-in"))
            continue
        for field, value in spec.items():
            shown = (
                value
                if isinstance(value, str)
                else (
                    _b(value)
                    if field == "mem_bytes"
                    else _si(value, "FLOP/s")
                    if "flops" in field
                    else _si(value, "B/s")
                    if "bytes_per_s" in field
                    else str(value)
                )
            )
            t.add_row(part, field, shown, sources.get(f"{part}.{field}", "built-in"))
    return t


def render(report: dict[str, Any]) -> None:
    """The theory report as rich tables on stdout."""
    model = report["model"]
    out.print(f"[bold]{safe(model['name'])}[/bold] ({safe(model['source'])}, {_b(model['total_bytes'])})")
    out.print(render_hardware(report["hardware"]))
    _render_decode(report["decode"])
    _render_prefill(report["prefill"])
    _render_experts(report["experts"])
    _render_attention(report["attention"])
    if report["placement"]:
        render_placement(report["placement"])
    render_prediction(report["prediction"])


def _print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table of right-aligned columns, one row per item of ``rows``."""
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*row)
    out.print(t)


def _render_decode(decode: dict[str, Any]) -> None:
    _print_table(
        "Decode: one token at depth n",
        ("depth", "weights read", "KV read", "FLOPs", "FLOP/byte"),
        (
            (str(r["depth"]), _b(r["weight_bytes"]), _b(r["kv_bytes"]), _si(r["flops"]), f"{r['intensity']:.2f}")
            for r in decode["rows"]
        ),
    )
    out.print(f"  why it stays flat: {decode['note']}")


def _render_prefill(prefill: dict[str, Any]) -> None:
    _print_table(
        "Prefill: one ubatch of B tokens at depth 0 (weights read once per ubatch)",
        ("B", "experts read", "weights read", "FLOPs/token", "FLOP/byte"),
        (
            (
                str(r["ubatch"]),
                f"{r['coverage']:.1%}",
                _b(r["weight_bytes"]),
                _si(r["flops_per_token"]),
                f"{r['intensity']:.1f}",
            )
            for r in prefill["rows"]
        ),
    )
    for r in prefill["ridges"]:
        b = r["compute_bound_ubatch"]
        out.print(
            f"  ridge {r['name']}: {r['flop_per_byte']:.1f} FLOP/byte; compute-bound from B = "
            f"{b if b is not None else 'never (below 65536)'}"
        )


def _render_experts(ex: dict[str, Any]) -> None:
    if not ex["n_expert"]:
        return
    cov = ex["coverage"]
    out.print(
        f"Expert coverage, {ex['n_expert_used']} of {ex['n_expert']} experts per token, uniform routing "
        f"1 - (1 - k/E)^B: " + ", ".join(f"B={b} {c:.4g}" for b, c in cov.items())
    )
    pad = ex.get("mmq_tile_padding") or {}
    if pad:
        out.print(
            "GPU expert matmuls: llama.cpp's MMQ tiles are sized by the ubatch, not by each expert's tokens, "
            "so they compute " + ", ".join(f"B={b} {p:.2f}x" for b, p in pad.items()) + " the useful work"
        )
    _print_table(
        "CPU-resident experts (--n-cpu-moe N): read per decode token and per ubatch",
        ("N", "in host", "per token", "per ubatch", "copy pinned", "copy pageable", "on CPU"),
        (
            (
                str(r["n_cpu_moe"]),
                _b(r["cpu_expert_bytes"]),
                _b(r["decode_bytes"]),
                _b(r["ubatch_bytes"]),
                _time(r["copy_s_pinned"]),
                _time(r["copy_s_pageable"]),
                _time(r["cpu_compute_s"]),
            )
            for r in ex["rows"]
        ),
    )


def _render_attention(att: dict[str, Any]) -> None:
    rows = att["rows"]
    _print_table(
        f"Attention: score entries and FLOPs grow as L^2, the KV cache as L (ubatch {att['ubatch']}); "
        "FA off keeps an f32 n_head x ubatch x n_kv score matrix per layer, FA on an f16 mask",
        ("L", "scores", "x", "KV", "x", "attn FLOPs", "of prefill", "FA off/layer", "FA on mask"),
        (
            (
                _k(r["length"]),
                _si(r["score_entries"]),
                f"{r['score_entries'] / rows[0]['score_entries']:.0f}x",
                _b(r["kv_bytes"]),
                f"{r['kv_bytes'] / rows[0]['kv_bytes']:.0f}x",
                _si(r["attention_flops"]),
                f"{r['attention_share']:.1%}",
                _b(r["fa_off_scores_bytes"]),
                _b(r["mask_bytes_fa_on"]),
            )
            for r in rows
        ),
    )
    out.print("  flash attention removes the score matrix from memory, not the quadratic FLOPs")


def render_placement(pl: dict[str, Any]) -> None:
    _print_table(
        f"Placement: smallest --n-cpu-moe that fits {_b(pl['budget_bytes'])} of VRAM "
        f"(keeping {_b(pl['headroom_bytes'])} free, ubatch {pl['ubatch']})",
        ("context", "--n-cpu-moe", "weights", "KV", "compute (rough)", "total"),
        (
            (
                _k(r["n_ctx"]),
                "does not fit" if r["n_cpu_moe"] is None else str(r["n_cpu_moe"]),
                _b(r["model_bytes"]),
                _b(r["kv_bytes"]),
                _b(r["compute_bytes"]),
                _b(r["total_bytes"]),
            )
            for r in pl["rows"]
        ),
    )


def render_prediction(pred: dict[str, Any]) -> None:
    """One small table per metric: a row per configuration, a column per prompt length."""
    configs = pred["configs"]
    lengths = [p["length"] for p in configs[0]["points"]]
    metrics: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
        ("prefill tok/s (L-token prompt)", lambda p: f"{p['prefill_tps']:,.0f}"),
        (f"pp{pred['pp_tokens']} tok/s at depth L", lambda p: f"{p['pp_tps']:,.0f}"),
        (f"pp{pred['pp_tokens']} tok/s at depth L: roofline limit (fp16 peak)", lambda p: f"{p['limit_pp_tps']:,.0f}"),
        ("decode tok/s at depth L", lambda p: f"{p['decode_tps']:,.1f}"),
        ("decode tok/s at depth L: roofline limit", lambda p: f"{p['limit_decode_tps']:,.1f}"),
        ("TTFT", lambda p: _time(p["ttft_s"])),
        (f"total for {pred['response_tokens']} response tokens", lambda p: _time(p["total_s"])),
    )
    for title, cell in metrics:
        t = Table(title=title if "limit" in title else f"Predicted {title}", title_justify="left")
        t.add_column("config")
        for L in lengths:
            t.add_column(f"L={_k(L)}", justify="right")
        for c in configs:
            t.add_row(c["label"], *(cell(p) for p in c["points"]))
        out.print(t)
    fits = {c["label"]: [p["fits"] for p in c["points"]] for c in configs}
    if any(f is False for v in fits.values() for f in v):
        for label, v in fits.items():
            short = [_k(L) for L, f in zip(lengths, v) if f is False]
            if short:
                out.print(f"  {label} does not fit the VRAM budget at L = {', '.join(short)}")
    crossing = [x for x in pred["crossovers"] if x["lengths"]]
    for x in crossing:
        ls = x["lengths"]
        where = (
            f"at {ls[0]:,} tokens"
            if len(ls) == 1
            else f"{len(ls)} sign changes from {ls[0]:,} to {ls[-1]:,} tokens (partial last ubatches make a sawtooth)"
        )
        out.print(
            f"  crossover {x['a']} vs {x['b']}: {where}; faster for short prompts: {x['faster_short']}, "
            f"at {x['max_length']:,} tokens: {x['faster_long']}"
        )
    never = [x for x in pred["crossovers"] if not x["lengths"]]
    if never:
        out.print(
            f"  {len(never)} other pair(s) never cross up to {never[0]['max_length']:,} tokens: one configuration "
            "is faster at every length"
        )
    out.print("  assumptions:")
    for a in pred["assumptions"]:
        out.print(f"    - {a}")


# --------------------------------------------------------------------------------------------------
# commands


def _built(build: Callable[..., dict[str, Any]], kw: dict[str, Any]) -> tuple[Any, bool, dict[str, Any]]:
    """The command's study directory, its --json flag, and what ``build`` makes of its other options, stamped
    with the moment after they were read."""
    study_dir, as_json, response, pp_tokens = (
        kw.pop("study_dir"),
        kw.pop("as_json"),
        kw.pop("response"),
        kw.pop("pp_tokens"),
    )
    from xover.analysis.theory import TheoryInputs

    inputs = _inputs(**kw)
    created_at, created_ns = _now()
    return (
        study_dir,
        as_json,
        build(
            TheoryInputs(
                created_at=created_at, created_unix_ns=created_ns, response=response, pp_tokens=pp_tokens, **inputs
            )
        ),
    )


def _store(study_dir: Path, name: str, body: dict[str, Any]) -> None:
    from xover.results.store import Store

    with Store(study_dir) as st:
        st.add_artifact(None, name, body)
    console.print(f"stored the {name} in {safe(study_dir)}")


def _list_hw(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from xover.domain.profiles import HOSTS, PROFILES, builtin

    for key, profile in PROFILES.items():
        hw = builtin(key)
        gpu = (
            f"{hw.gpu.name}: {_si(hw.gpu.fp16_flops_per_s, 'FLOP/s')} fp16, {_si(hw.gpu.mem_bw_bytes_per_s, 'B/s')}, "
            f"{_b(hw.gpu.mem_bytes)}"
            if hw.gpu
            else "no GPU"
        )
        out.print(f"{key:12s} {gpu}; host: {HOSTS[profile.host].name}")
    ctx.exit()


@click.command()
@_options(study_required=False)
@click.option(
    "--list-hw",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_list_hw,
    help="List the built-in hardware profiles and exit.",
)
def theory(**kw: Any) -> None:
    """Roofline theory of a model on a machine: intensity, expert coverage, quadratic attention,
    ridge points, predicted tok/s, TTFT and crossovers, and where --n-cpu-moe must start to fit VRAM.

    \b
      xover theory -m preset:qwen3-30b-a3b --hw h200 --ncmoe 0,12,18,24
      xover theory -m model.gguf --vram 16GiB --ncmoe 12,18 --load-mode mmap,none
    """
    from xover.analysis.theory import theory_report

    study_dir, as_json, report = _built(theory_report, kw)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        render(report)
    if study_dir:
        _store(study_dir, "theory", report)


@click.command()
@_options(study_required=True)
def predict(**kw: Any) -> None:
    """Store a timestamped roofline prediction in a study BEFORE measuring it, so the report can show
    predicted against measured without hindsight.

    \b
      xover predict -m preset:qwen3-30b-a3b --hw h200 --ncmoe 12,18 -o study/
    """
    from xover.analysis.theory import build_prediction
    from xover.results.store import Store

    study_dir, as_json, pred = _built(build_prediction, kw)
    with Store(study_dir) as st:
        measured = len(st.bench_results()) + len(st.ttft_samples())
    pred["measurements_before"] = measured
    if measured:
        console.print(
            f"[yellow]warning:[/yellow] {safe(study_dir)} already holds {measured} measurements: this prediction is "
            "not blind; predict into a fresh study before measuring"
        )
    if as_json:
        click.echo(json.dumps(pred, indent=2))
    else:
        render_prediction(pred)
    _store(study_dir, "prediction", pred)
