"""`xover report STUDY_DIR`."""

from __future__ import annotations

from pathlib import Path

import click

from xover.console import console, out, safe

# The library's imports stand inside the commands, for start-up time: `xover --help` imports every command's module
# (click asks each for its help line) and the library takes about 0.5 s to import (xover.measure.study).


def _ints(value: str) -> tuple[int, ...]:
    from xover.errors import XoverError

    try:
        vals = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise XoverError(f"--response-tokens {value!r}: give integers, e.g. 200 or 100,200,500") from None
    if any(v <= 0 for v in vals):
        raise XoverError(f"--response-tokens {value!r}: response lengths must be positive")
    return vals


@click.command()
@click.argument("study_dir", type=click.Path(path_type=Path))
@click.option(
    "--response-tokens",
    "-R",
    default=None,
    help="Response length(s) R for total(L) = TTFT(L) + R / decode_tok_s(L); comma list allowed. Default: the "
    "study's own response-tokens (200 for a store without them).",
)
@click.option(
    "--band",
    default=None,
    help="Agentic-turn band LO,HI in prompt tokens. Default: the study's own band (10000,40000 without one).",
)
@click.option(
    "--bootstrap",
    default=500,
    show_default=True,
    type=click.IntRange(min=0),
    help="Bootstrap resamples for the crossover interval (0 to skip).",
)
def report(study_dir: Path, response_tokens: str | None, band: str | None, bootstrap: int) -> None:
    """Rebuild the HTML and markdown report of a study directory from its results store alone.

    Works offline on any machine: copy the study directory and run this. Writes report.html
    (plots embedded), report.md and the plots as PNG into STUDY_DIR. With several response
    lengths the first one drives the plots; each gets its own verdict lines.
    """
    from xover.errors import XoverError
    from xover.report.html import build_report, write_report
    from xover.results.read_model import load

    data = load(study_dir)
    recorded = data.recorded_turns()
    responses = _ints(response_tokens) if response_tokens is not None else (recorded[0] if recorded else (200,))
    lo_hi = _ints(band) if band is not None else (recorded[1] if recorded else (10_000, 40_000))
    if len(lo_hi) != 2 or lo_hi[0] >= lo_hi[1]:
        raise XoverError(f"--band {band!r}: give LO,HI with LO < HI, e.g. 10000,40000")
    first = None
    for r in responses:
        rep = build_report(data, response=r, band=(lo_hi[0], lo_hi[1]), n_boot=bootstrap)
        first = first or rep
        for v in rep.verdicts:
            out.print(f"\\[R={r}] {safe(v)}")
    assert first is not None
    html_path, md_path = write_report(first, study_dir)
    console.print(f"wrote {safe(html_path)} and {safe(md_path)}")
