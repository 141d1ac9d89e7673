"""The tests of tests/unit/test_defaults_fit_the_model.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from procs import one_line_error, run_xover


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    return write_model(PRESETS["tiny-moe"], tmp_path_factory.mktemp("m") / "tiny.gguf").path  # 4 layers, 32K context


# ---- item 1: the session ---------------------------------------------------------------------------


def test_session_cli_says_which_turns_fit_before_starting_anything(tiny: Path, tmp_path: Path) -> None:
    r = run_xover("session", "-m", str(tiny), "--turns", "30", "-o", str(tmp_path / "s"))
    one_line_error(r, "at most 16 turns fit; give --turns 16 or fewer")
    r = run_xover("session", "-m", str(tiny), "--target-tokens", "40k", "-o", str(tmp_path / "s"))
    one_line_error(r, "at most 32,704 fit")
    assert not (tmp_path / "s").exists()


# ---- item 1: lengths beyond the context name those that fit ---------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("ttft", "--lengths", "1k,4k,16k,32k", "-R", "200"), "of those given, --lengths 1k,4k,16k fit"),
        (
            ("advise", "--lengths", "8k,32k"),
            "exceeds xover synthetic tiny-moe's training context of 32,768 tokens: of those given, --lengths 8k fit",
        ),
    ],
)
def test_commands_whose_lengths_exceed_the_context_say_which_fit(
    tiny: Path, tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    one_line_error(run_xover(*args, "-m", str(tiny), "-o", str(tmp_path / "o")), needle)
    assert not (tmp_path / "o").exists()


# ---- item 1: advise's agentic band ------------------------------------------------------------------


# ---- item 2: -R / --response-tokens everywhere ------------------------------------------------------


# ---- item 4: warnings that rest on facts -----------------------------------------------------------
