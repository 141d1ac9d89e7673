"""The tests of tests/unit/test_bad_input.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from procs import one_line_error, run_xover


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    return write_model(PRESETS["tiny-moe"], tmp_path_factory.mktemp("bad") / "tiny.gguf", seed=0).path


# ---- options of the commands that start servers ----------------------------------------------------


def _usage_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    """click's own option errors: usage, then one `Error:` line naming the option."""
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert needle in [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")][0], r.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("ttft", "--ncmoe", "2,9", "--lengths", "256"),
        ("cache", "--ncmoe", "9", "--length", "1k"),
        ("session", "--ncmoe", "2,9", "--turns", "2", "--target-tokens", "2k", "--system-tokens", "512"),
    ],
)
def test_offload_beyond_layers_fails_before_any_server(command: tuple[str, ...], model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    line = one_line_error(
        run_xover(*command, "-m", str(model), "-o", str(out), "--llama-bin-dir", str(tmp_path / "none")),
        "--n-cpu-moe 9 is beyond",
    )
    assert "use 0..4" in line
    assert not (out / "results.sqlite").exists()


@pytest.mark.parametrize(
    "command, needle",
    [
        (("ttft", "--lengths", "64k"), "exceed"),
        (("cache", "--length", "40k"), "exceed"),
        (("session", "--turns", "2", "--target-tokens", "64k", "--system-tokens", "1k"), "exceed"),
        (
            ("ttft", "--lengths", "1k", "--", "-c", "512"),
            "-c 512 after `--` is shorter than the longest prompt plus response",
        ),
        (("cache", "--length", "2k", "--", "--ctx-size=1024"), "--ctx-size 1024 after `--` is shorter"),
        (
            ("session", "--turns", "2", "--target-tokens", "4k", "--system-tokens", "1k", "--ctx-size", "1024"),
            "--ctx-size 1024 is shorter than the session's last turn",
        ),
        (("ttft", "--lengths", "0"), "length '0' must be at least 1 token"),
        (("ttft", "--lengths=-5"), "length '-5' is not a number of tokens"),
        (("ttft", "--lengths", "1k,abc"), "length 'abc' is not a number of tokens"),
        (("ttft", "--lengths", "256", "--ncmoe", "x"), "--ncmoe"),
        # the option table's values are checked as the table says, alike in every command
        (("cache", "--length", "1k", "--ncmoe", "-1"), "--ncmoe: n-cpu-moe must be a non-negative integer"),
        (("session", "--turns", "2", "--threads", "0"), "--threads: threads must be an integer of at least 1"),
    ],
)
def test_lengths_and_contexts(command: tuple[str, ...], needle: str, model: Path, tmp_path: Path) -> None:
    # a bin dir that does not exist: every check must come before the binaries are even looked up
    args = list(command)
    tail = args[args.index("--") :] if "--" in args else []
    head = args[: len(args) - len(tail)]
    one_line_error(
        run_xover(*head, "-m", str(model), "-o", str(tmp_path / "o"), "--llama-bin-dir", str(tmp_path / "none"), *tail),
        needle,
    )


@pytest.mark.parametrize(
    "command, needle",
    [
        (("ttft", "-r", "0"), "-r"),
        (("ttft", "--response-tokens", "0"), "--response-tokens"),
        (("session", "--turns", "0"), "--turns"),
        (("session", "--ctx-size", "-1"), "--ctx-size"),
    ],
)
def test_zero_and_negative_counts(command: tuple[str, ...], needle: str, model: Path) -> None:
    _usage_error(run_xover(*command, "-m", str(model)), needle)


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[model]\npreset = "no-such-model"\n[[config]]\nname = "a"\n', "no-such-model"),
        (
            '[model]\npreset = "tiny-moe"\n[study]\nlengths = [0]\n[[config]]\nname = "a"\n',
            "[study] lengths: length 0 must be at least 1 token",
        ),
        (
            '[model]\npreset = "tiny-moe"\n[study]\nrepetitions = 0\n[[config]]\nname = "a"\n',
            "repetitions must be at least 1",
        ),
        ('[model]\npreset = "tiny-moe"\n[study]\nlenghts = [1024]\n[[config]]\nname = "a"\n', "unknown key 'lenghts'"),
        ('[model]\npreset = "tiny-moe"\n[[config]]\nname = "a"\nthreds = 2\n', "unknown key 'threds'"),
        (
            '[model]\npreset = "tiny-moe"\n[[config]]\nname = "a"\nserver-args = "-c 4096"\n',
            "server-args must be a list",
        ),
        ('[model]\npreset = "tiny-moe"\n[study]\ntimeout = -1\n[[config]]\nname = "a"\n', "timeout must be a positive"),
        ('[model]\npreset = "tiny-moe"\n', "at least one configuration"),
        ('[model\npreset = "tiny-moe"\n', "spec"),  # not TOML at all
        ('[model]\npreset = "tiny-moe"\n[[config]]\nname = "a"\nn-cpu-moe = 9\n', "--n-cpu-moe 9 is beyond"),
        (
            '[model]\npreset = "tiny-moe"\n[[config]]\nname = "mine"\ncommand = "llama-server -m m.gguf -ub x"\n',
            "[[config]] 'mine' command -ub: ubatch-size must be an integer",
        ),
        (
            '[model]\npreset = "tiny-moe"\n[[config]]\nname = "mine"\ncommand = "llama-server -m m.gguf"\nthreads = 2\n',
            "'threads' beside command: give its flag in the command instead",
        ),
    ],
)
def test_malformed_study_specs(text: str, needle: str, tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    one_line_error(run_xover("study", str(spec), "-o", str(tmp_path / "out"), "-q"), needle)
    assert not (tmp_path / "out" / "results.sqlite").exists()  # nothing measured


# ---- no shell strings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "needle"),
    [
        ("llama-server -m m.gguf -rtr", "--baseline: -rtr is a flag of ik_llama.cpp's llama-server"),
        ("llama-server -ngl 99", "--baseline: the command names no model: add -m FILE.gguf"),
        ("llama-server -m m.gguf -ub 0", "--baseline -ub: ubatch-size must be an integer of at least 1"),
    ],
)
def test_a_baseline_command_xover_cannot_run_is_refused_before_anything_runs(
    command: str, needle: str, tmp_path: Path
) -> None:
    """Issue 67: `xover study --baseline "..."` reads the user's command before anything runs; one it cannot run is
    refused in one line that names the flag, and nothing is stored."""
    one_line_error(run_xover("study", "--baseline", command, "-o", str(tmp_path / "out"), "-q"), needle)
    assert not (tmp_path / "out" / "results.sqlite").exists()
