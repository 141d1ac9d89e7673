"""Every README command parses with xover's own option parser (no binaries; the real tier runs them).

The fast half of issue 18's README-commands check: each command of the README's code blocks and
command table (tests/readme_commands.py says how they are extracted and made concrete), the GPU-only
ones included, goes through click exactly as ``xover`` parses a command line, without running the
command. An unknown flag or a bad choice fails here in milliseconds; tests/real/test_readme_commands.py
then runs every command on the tiny model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import click
import pytest

from readme_commands import Substitutions, Variant, describe, extract, readme_variants, substitute, variants
from xover.cli import cli

VARIANTS = readme_variants()


def _subs(tmp: Path) -> Substitutions:
    return Substitutions(
        model=tmp / "tiny.gguf",
        out=tmp,
        spec=tmp / "spec.toml",
        spec_configs="a,b",
        workload=tmp / "workload.txt",
        n_layer=4,
    )


def parse(argv: list[str]) -> None:
    """Parse ``xover ARGV`` the way `xover` does, down to the leaf command; nothing runs."""
    group: click.Command = cli
    ctx = group.make_context("xover", list(argv))
    while isinstance(group, click.Group):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*ctx.protected_args, *ctx.args]
        name, sub, args = group.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, args, parent=ctx)
        group = sub


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_readme_command_parses(variant: Variant, tmp_path: Path) -> None:
    argv = substitute(variant.argv, _subs(tmp_path))
    try:
        parse(argv)
    except click.UsageError as e:
        pytest.fail(f"{describe(variant, argv)}: {e.format_message()}")


def test_the_readme_shows_every_command() -> None:
    names = {v.argv[0] for v in VARIANTS}
    assert names == {
        "study",
        "bench",
        "ttft",
        "cache",
        "audit",
        "session",
        "advise",
        "report",
        "export",
        "theory",
        "predict",
        "synth",
        "inspect",
        "llama",
    }
    assert [v.skip for v in VARIANTS if v.skip] == [
        "builds llama.cpp for CUDA: needs the CUDA toolkit and an NVIDIA GPU"
    ]


def test_an_unknown_flag_in_a_code_block_or_the_table_fails(tmp_path: Path) -> None:
    text = (
        "```bash\n$ xover ttft -m M --lengths 1k --bogus-flag 3   # a comment\n```\n\n"
        "| command | what |\n|---|---|\n| `xover bench -m M [--nope]` / `xover llama which` | x |\n"
    )
    commands = extract(text)
    assert [(c.source, c.text) for c in commands] == [
        ("code block, line 2", "xover ttft -m M --lengths 1k --bogus-flag 3"),
        ("command table, line 7", "xover bench -m M [--nope]"),
        ("command table, line 7", "xover llama which"),
    ]
    for command, bad in zip(commands, ("--bogus-flag", "--nope", None)):
        (variant,) = variants(command)
        if bad is None:
            parse(substitute(variant.argv, _subs(tmp_path)))
            continue
        with pytest.raises(click.NoSuchOption, match=bad):
            parse(substitute(variant.argv, _subs(tmp_path)))


def test_substitutions_change_only_placeholders_and_sizes(tmp_path: Path) -> None:
    s = _subs(tmp_path)
    argv = ("ttft", "-m", "M", "--ncmoe", "12,18", "--lengths", "1k,4k,16k,32k", "-R", "200", "-r", "3")
    assert substitute(argv, s) == [
        "ttft",
        "-m",
        str(s.model),
        "--ncmoe",
        "1,2",
        "--lengths",
        "64,256,1024,2048",
        "-R",
        "200",
        "-r",
        "3",
    ]
    assert substitute(("bench", "--depth", "1000,32000", "--", "ARGS"), s) == [
        "bench",
        "--depth",
        "62,2000",
        "--",
        "-ngl",
        "99",
    ]
    assert substitute(("synth", "--preset", "qwen3-30b-a3b", "-o", "q.gguf"), s) == [
        "synth",
        "--preset",
        "tiny-moe",
        "-o",
        str(tmp_path / "q.gguf"),
    ]
    with pytest.raises(AssertionError, match="no substitution rule"):
        substitute(("report", "NEWTHING"), s)
