"""Strings xover did not write stay inert in the terminal (issue 18, item 5).

A GGUF's ``general.name`` (or architecture, or a tensor name) and a path reach the terminal through
rich. Rich reads ``[bold]`` in them as markup and passes escape sequences through, so a file named
``model[Q4_K_M].gguf`` lost its brackets and a hostile file could recolour, clear or retitle the
terminal. Here every such string is printed with markup escaped and control characters spelled out.
The GGUF with an escape sequence in ``general.name`` is a real synthesized tiny-moe with its name
patched in place (same byte length, so the header stays valid).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.table import Table

from procs import run_xover
from xover.console import InertConsole, safe
from xover.gguf.inspect import inspect_gguf, render_text
from xover.untrusted import visible

NAME = b"xover synthetic tiny-moe"
# Set red, set the window title (OSC ... BEL), clear the screen (C1 CSI), then a right-to-left override.
HOSTILE = "\x1b[31m\x1b]0;pw\x07\x9b2J\u202e"
HOSTILE_BYTES = HOSTILE.encode()
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    return write_model(PRESETS["tiny-moe"], tmp_path_factory.mktemp("m") / "tiny.gguf").path


@pytest.fixture(scope="module")
def hostile_model(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = model.read_bytes()
    assert data.count(NAME) == 1
    evil = HOSTILE_BYTES + b"!" * (len(NAME) - len(HOSTILE_BYTES))
    assert len(evil) == len(NAME)
    path = tmp_path_factory.mktemp("h") / "hostile.gguf"
    path.write_bytes(data.replace(NAME, evil))
    return path


def test_visible_spells_out_control_and_bidi_characters() -> None:
    assert visible("plain name [Q4_K_M] ünïcode 模型") == "plain name [Q4_K_M] ünïcode 模型"
    assert visible("a\x1b[31mb\x07c\rd\x7f\x9b") == "a\\x1b[31mb\\x07c\\x0dd\\x7f\\x9b"
    assert visible("x\u202ey\u2066z") == "x\\u202ey\\u2066z"
    assert visible("line1\nline2\tcol") == "line1\\x0aline2\\x09col"
    assert visible("line1\nline2\tcol", keep_newlines=True) == "line1\nline2\tcol"


def test_safe_escapes_markup_too() -> None:
    buf = io.StringIO()
    InertConsole(file=buf, width=200, highlight=False).print(f"wrote {safe('p[bold]x.gguf')} {safe(HOSTILE)}")
    text = buf.getvalue()
    assert "wrote p[bold]x.gguf" in text
    assert not any(c in text for c in RAW)
    assert "\\x1b[31m" in text and "\\u202e" in text


def test_the_consoles_spell_out_control_characters_in_every_rendered_string() -> None:
    """Lines, table cells and titles: the consoles never pass a control character from their input,
    while their own styling still reaches a terminal."""
    buf = io.StringIO()
    console = InertConsole(file=buf, width=200, highlight=False, force_terminal=True, color_system="standard")
    t = Table(title=f"title {HOSTILE}")
    t.add_column(f"col {HOSTILE}")
    t.add_row(f"cell {HOSTILE}")
    console.print(f"[bold]line[/] {HOSTILE}", t)
    text = buf.getvalue()
    assert text.count("\\x1b[31m") == 4  # the line, the title, the header and the cell
    assert "\x1b[1m" in text  # rich's own bold still works on a terminal
    assert "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    assert "\x1b]0;" not in text


def test_inspect_prints_a_bracketed_file_name_as_it_is(model: Path, tmp_path: Path) -> None:
    path = tmp_path / "p[bold]x.gguf"
    path.write_bytes(model.read_bytes())
    r = run_xover("inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert f"({path})" in r.stdout.splitlines()[0]
    named = tmp_path / "model[Q4_K_M].gguf"
    named.write_bytes(model.read_bytes())
    assert "model[Q4_K_M].gguf" in run_xover("inspect", str(named)).stdout


def test_inspect_prints_an_escape_sequence_in_general_name_spelled_out(hostile_model: Path) -> None:
    report = inspect_gguf(hostile_model)
    assert report.name is not None and report.name.startswith(HOSTILE)  # the data stays exact
    r = run_xover("inspect", str(hostile_model))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("\\x1b[31m\\x1b]0;pw\\x07\\x9b2J\\u202e!!!!!"), first
    assert not any(c in r.stdout + r.stderr for c in RAW)
    assert render_text(report).splitlines()[0] == first


def test_inspect_json_keeps_the_exact_string_json_escaped(hostile_model: Path) -> None:
    r = run_xover("inspect", str(hostile_model), "--json")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\\u001b[31m" in r.stdout
    assert json.loads(r.stdout)["name"].startswith(HOSTILE)


def test_errors_that_quote_the_file_are_inert(hostile_model: Path, tmp_path: Path) -> None:
    """An error naming the model (its general.name) or its path: one line, nothing raw."""
    r = run_xover("bench", "-m", str(hostile_model), "--ncmoe", "9", "--depth", "0", "-o", str(tmp_path / "b"))
    assert r.returncode != 0 and "is beyond" in r.stderr and "\\x1b[31m" in r.stderr
    assert not any(c in r.stderr for c in RAW)
    assert len(r.stderr.strip().splitlines()) == 1
    odd = tmp_path / "bad\x1b[2Jname.gguf"
    odd.write_bytes(b"GGUF\x03\x00\x00\x00")
    r = run_xover("inspect", str(odd))
    assert r.returncode != 0 and "\\x1b[2J" in r.stderr and "\x1b" not in r.stderr


def test_synth_reports_a_bracketed_output_path(tmp_path: Path) -> None:
    out = tmp_path / "q[bold]x.gguf"
    r = run_xover("synth", "--preset", "tiny-moe", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stderr.replace("\n", "")


def test_report_and_export_print_a_bracketed_study_path(tmp_path: Path) -> None:
    import shutil

    study = tmp_path / "p[bold]x"
    study.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "studies" / "h200-smoke" / "results.sqlite", study)
    r = run_xover("report", str(study))
    assert r.returncode == 0, r.stderr
    assert f"wrote{study}/report.htmland{study}/report.md" in "".join(r.stderr.split())  # rich wraps long lines
    r = run_xover("export", str(study), "--format", "csv", "-o", str(study / "bench[red].csv"))
    assert r.returncode == 0, r.stderr
    assert "p[bold]x/bench[red].csv" in "".join(r.stderr.split())
