"""`xover study`: the whole investigation in one resumable command."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from xover.cli import options

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).

if TYPE_CHECKING:
    from xover.domain.study_spec import StudySpec
    from xover.measure.study import StudyOutcome


@click.command()
@click.argument("spec_file", required=False, type=click.Path(path_type=Path, dir_okay=False))
@options.study_dir("Study directory [default: studies/<spec name>, or studies/default].", default=None)
@click.option(
    "--fresh", is_flag=True, help="Measure everything again instead of skipping what the store already holds."
)
@click.option(
    "--remeasure",
    default="",
    metavar="STAGE,...",
    help="Measure these stages again and resume the others (model: llama.cpp's check of the placement; tune, "
    "bench, ttft, cache, session). The stored results stay: cold TTFT adds new rounds of fresh servers after them, "
    "and its rounds supersede samples measured before rounds (e.g. --remeasure ttft on a study measured before "
    "rounds keeps its placement and tuning).",
)
@options.engine_bin_dirs()
@click.option(
    "--skip",
    default="",
    metavar="STAGE,...",
    help="Stages to leave out this time, on top of the spec's skip (theory, tune, bench, ttft, cache, session, "
    "report). Skipping tune still measures tuned variants already stored.",
)
@click.option(
    "--configs",
    "only_configs",
    default="",
    metavar="NAME,...",
    help="Measure only these configurations this time (the store keeps the others; the report shows all; "
    "the cache lab runs on the first one named).",
)
@options.vram_budget("study")
@click.option(
    "--workload",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    metavar="FILE",
    help="Your own turns (xover record -o FILE, --shape-only or --from-log): the study measures the lengths, "
    "cached turns, depth and answer length they need, replays them on every configuration, and answers in minutes "
    "of waiting over them. Replaces the spec's lengths, cached-turns, cached-depth and response-tokens.",
)
@click.option(
    "--baseline",
    default=None,
    metavar='"llama-server ..."',
    help="Your own llama-server command line, measured as the configuration 'yours' beside the spec's and first in "
    "the verdict: the flags the option table knows become settings (checked), -m and -c are the study's, --port, "
    "--host and --log-file are xover's, anything else passes through as given. A flag xover cannot run is refused "
    "before anything runs.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress bars; only the verdict and errors (for CI).")
@click.option(
    "--progress-jsonl",
    type=click.File("w"),
    default=None,
    metavar="FILE",
    help="Write progress events as JSON lines to FILE ('-' for stdout), for other programs.",
)
def study(
    spec_file: Path | None,
    study_dir: Path | None,
    fresh: bool,
    remeasure: str,
    llama_bin_dirs: dict[str, Path],
    skip: str,
    only_configs: str,
    vram_budget: str | None,
    workload: Path | None,
    baseline: str | None,
    quiet: bool,
    progress_jsonl: IO[str] | None,
) -> None:
    """Run the whole investigation: theory and a stored prediction, llama-bench prefill/decode
    sweeps at depth, cold TTFT per configuration and prompt length (and, with [study] cached-turns,
    cached agentic turns: new tokens on a context the slot's cache holds), then the report and a
    verdict.

    SPEC_FILE is a TOML study spec (see examples/seed-qwen3-coder-30b.toml). Without one, the
    embedded default runs: the synthetic tiny-moe model on this machine's llama.cpp build, done in
    a few minutes on 2 CPU cores. Rerunning a study skips every point already measured (--fresh
    redoes them); an interrupted study continues where it stopped. --configs and --skip narrow one
    invocation (e.g. reach the cache lab before a slow configuration's TTFT) without changing the spec.
    """
    from xover.console import console
    from xover.domain.study_spec import load_spec
    from xover.llamacpp.binaries import resolve_chosen
    from xover.measure.study import run_study

    # A bad spec is reported before a missing build: the spec is what the user is editing.
    loaded = load_spec(spec_file) if spec_file is not None else None
    binaries = resolve_chosen(llama_bin_dirs)
    spec, intro = (loaded, None) if loaded is not None else _default_for_this_machine(binaries)
    if baseline is not None:
        from xover.domain.study_spec import with_baseline

        spec = with_baseline(spec, baseline)
    spec = narrow(spec, skip, only_configs)
    if vram_budget is not None:
        import dataclasses

        from xover.hardware.vram import parse_budget

        spec = dataclasses.replace(spec, vram_budget=parse_budget(vram_budget))
    if workload is not None:
        import dataclasses

        spec = dataclasses.replace(spec, workload=workload.resolve())
    out_dir = study_dir or Path("studies") / (spec_file.stem if spec_file else "default")
    emit, close = _progress(quiet, progress_jsonl)
    if intro and not quiet:
        console.print(intro)
    from xover.measure.study import StageEvent
    from xover.measure.workers import study_workers

    try:
        # rpc-local workers run for the whole study (and stop on every way out); the configurations get their --rpc.
        with study_workers(spec, out_dir, binaries, lambda line: emit(StageEvent("model", "info", line))) as spec:
            outcome = run_study(
                spec,
                out_dir,
                binaries,
                fresh=True if fresh else {x.strip() for x in remeasure.split(",") if x.strip()},
                command=["xover", *sys.argv[1:]],
                emit=emit,
                report=write_report,
            )
    finally:
        close()
    _print_outcome(outcome, out_dir)


def _print_outcome(outcome: StudyOutcome, out_dir: Path) -> None:
    """The verdicts, the tuned settings, the stage times, the report's path and the failures."""
    from rich.markup import escape

    from xover.console import out, safe

    out.print(f"\n[bold]Verdict[/] ({escape(str(out_dir))}):")
    for v in outcome.verdicts or ("no pair of configurations could be compared; see the report",):
        out.print(f"  - {escape(v)}")
    if outcome.tuned:
        out.print(
            "\n[bold]Tuned settings[/] (each configuration's fastest measured, llama-bench over the study's lengths):"
        )
        for t in outcome.tuned:
            if t.changed:
                out.print(f"  - {escape(t.config.name)}: {escape(t.label)}\n      {escape(t.server_command)}")
            else:
                out.print(f"  - {escape(t.config.name)}: {t.config.engine}'s defaults (no knob beat the noise)")
            if t.decode_variant is not None:
                out.print(
                    f"    for decode-heavy turns: {escape(t.decode_label)}\n"
                    f"      {escape(t.decode_variant.server_command(outcome.model.name))}"
                )
    if outcome.stage_seconds:
        out.print(
            "stage times: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in outcome.stage_seconds.items())
            + f"; total {sum(outcome.stage_seconds.values()):.0f} s"
        )
    if outcome.report_html:
        out.print(f"report: {safe(outcome.report_html)}")
    if outcome.failures:
        out.print(
            f"[yellow]{outcome.failures} configuration(s) or point(s) failed; they are recorded in the store "
            "and listed in the report[/]"
        )


def write_report(spec: StudySpec, study_dir: Path) -> tuple[tuple[str, ...], Path]:
    """The study's report stage: report.html/.md rebuilt from the store, and the verdicts per response length."""
    from xover.report.html import build_report
    from xover.report.html import write_report as write_files
    from xover.results.read_model import load

    data = load(study_dir)
    verdicts: list[str] = []
    first = None
    for r in spec.response_tokens:
        rep = build_report(data, response=r, band=spec.band)
        first = first or rep
        verdicts += [f"[R={r}] {v}" if len(spec.response_tokens) > 1 else v for v in rep.verdicts]
    assert first is not None
    html_path, _ = write_files(first, study_dir)
    return tuple(verdicts), html_path


def narrow(spec: StudySpec, skip: str, only_configs: str) -> StudySpec:
    """``spec`` with more stages skipped and/or fewer configurations, for one invocation."""
    import dataclasses

    from xover.domain.study_spec import STAGES
    from xover.errors import XoverError

    stages = {s.strip() for s in skip.split(",") if s.strip()}
    unknown = stages - set(STAGES)
    if unknown:
        raise XoverError(f"--skip {sorted(unknown)[0]!r} is not a stage: use some of {', '.join(STAGES)}")
    names = [n.strip() for n in only_configs.split(",") if n.strip()]
    known = [c.name for c in spec.configs]
    missing = [n for n in names if n not in known]
    if missing:
        raise XoverError(f"--configs {missing[0]!r} is not in the spec: use some of {', '.join(known)}")
    configs = tuple(c for c in spec.configs if c.name in names) if names else spec.configs
    pairs = tuple(p for p in spec.pairs if all(n in {c.name for c in configs} for n in p))
    return dataclasses.replace(spec, skip=spec.skip | stages, configs=configs, pairs=pairs)


def _default_for_this_machine(binaries: object) -> tuple[StudySpec, str]:
    """The embedded default: offload levels from the placement planner when a GPU and a GPU build are
    present, else the CPU comparison on tiny-moe."""
    from xover.analysis.default_study import gpu_default_spec
    from xover.domain.study_spec import default_spec
    from xover.hardware.detect import detect_gpu

    manifest = getattr(binaries, "manifest", None)
    gpu = detect_gpu()
    free = (gpu.free_bytes or gpu.total_bytes) if gpu else None
    if gpu is not None and free and (manifest is None or manifest.backend != "cpu"):
        spec = gpu_default_spec(free)
        names = " vs ".join(c.name for c in spec.configs)
        return spec, (
            f"[bold]Default study[/] on {gpu.name} ({free / 2**30:.0f} GiB free): the synthetic "
            f"qwen3-30b-a3b shape, {names} (the placement planner's minimum offload for an 8K context vs "
            "the offload a 32K context forces), prompts of 1K-32K tokens."
        )
    return default_spec(), (
        "[bold]Default study[/]: tiny-moe on this machine's CPU. Without a GPU, --n-cpu-moe moves "
        "nothing, so it asks the same question (does what wins short turns lose long ones?) of "
        "flash attention on vs off, which trade prefill for decode on a CPU, each at llama.cpp's "
        "defaults and at the settings the tuning stage finds best here. For the offload question, "
        "run a spec with --n-cpu-moe configurations on a GPU machine "
        "(examples/seed-qwen3-coder-30b.toml)."
    )


def _progress(quiet: bool, jsonl: IO[str] | None):  # type: ignore[no-untyped-def]
    """An emit function for study events: rich bars (overall + stage), JSON lines, or nothing."""
    from rich.markup import escape

    from xover.console import console, progress_bar
    from xover.measure.study import STAGE_ORDER, StageEvent

    bar = None if quiet else progress_bar()
    overall = stage_task = None
    if bar is not None:
        bar.start()
        overall = bar.add_task("study", total=len(STAGE_ORDER))
        stage_task = bar.add_task("", total=None)

    def emit(ev: StageEvent) -> None:
        if jsonl is not None:
            jsonl.write(json.dumps({"t": time.time(), **ev.__dict__}) + "\n")
            jsonl.flush()
        if bar is None:
            if ev.status == "fail":
                console.print(f"[red]{ev.stage}: {escape(ev.detail)}[/]")
            return
        assert overall is not None and stage_task is not None
        if ev.status == "start":
            bar.reset(stage_task, total=1, completed=0, description=ev.stage)
        elif ev.status == "progress":
            description = escape(f"{ev.stage} {ev.detail}".strip())
            if ev.total is not None:
                bar.update(stage_task, description=description, completed=ev.completed or 0, total=ev.total)
            else:
                bar.update(stage_task, description=description)
        elif ev.status in ("done", "skip"):
            if ev.status == "skip":
                console.print(f"[dim]{ev.stage}: {escape(ev.detail)}[/]")
            bar.update(stage_task, completed=1, total=1)
            bar.advance(overall, 1)
        elif ev.status == "info":
            console.print(f"[dim]{ev.stage}: {escape(ev.detail)}[/]")
        elif ev.status == "fail":
            console.print(f"[red]{ev.stage}: {escape(ev.detail)}[/]")

    def close() -> None:
        if bar is not None:
            bar.stop()

    return emit, close
