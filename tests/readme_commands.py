"""The `xover ...` commands the README shows, extracted and made concrete for the tiny model.

Used by ``tests/real/test_readme_commands.py`` (runs every command) and
``tests/unit/test_readme_commands_parse.py`` (parses every command with xover's own option parser,
no binaries). The README writes commands two ways:

* **code blocks** (```` ``` ````): every line that starts with ``xover `` (after an optional ``$ ``), a
  trailing ``# comment`` dropped, ``\\`` continuations joined;
* **the command table** (``| `xover ...` | what it answers |``): every code span of the first cell,
  spans joined by `` / `` being separate commands. Cells are synopses: ``[...]`` marks an optional
  group, ``a\\|b`` alternatives, UPPERCASE words placeholders.

A synopsis becomes concrete argument lists (:func:`variants`): every optional group is included (so
every flag the README shows is exercised), and each alternative of a word is a variant of its own.
Then :func:`substitute` replaces placeholders and sizes, and nothing else (the rules are listed on
:class:`Substitutions`). A placeholder it does not know fails the test: a new README placeholder
needs a rule here.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the pages whose `xover ...` commands are run as written: the README, and the guide that shows each command
DOCS = (README, ROOT / "docs" / "guide.md")

# Optional groups that need hardware the CI machine lacks: the variant with the group is reported as
# skipped with this reason (and still parsed by the unit test); the variant without it runs.
NEEDS_GPU = {"--backend cuda": "builds llama.cpp for CUDA: needs the CUDA toolkit and an NVIDIA GPU"}

PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.[a-z]+)?(,\.\.\.)?$|\.\.\.")


@dataclasses.dataclass(frozen=True)
class ReadmeCommand:
    source: str  # "code block, line N" / "command table, line N"
    text: str  # as the README writes it


@dataclasses.dataclass(frozen=True)
class Variant:
    command: ReadmeCommand
    argv: tuple[str, ...]  # after "xover", placeholders still in
    skip: str | None = None  # why it cannot run here (a GPU group)

    @property
    def id(self) -> str:
        return " ".join(self.argv)


def extract(text: str) -> list[ReadmeCommand]:
    """Every `xover ...` command of the README's code blocks and command table, in README order."""
    found: list[ReadmeCommand] = []
    in_block = False
    pending = ""
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            stripped = line.strip()
            if stripped.startswith("$ "):
                stripped = stripped[2:]
            if pending:
                stripped, pending = pending + " " + stripped, ""
            if not stripped.startswith("xover "):
                continue
            if stripped.endswith("\\"):
                pending = stripped[:-1].strip()
                continue
            code = _drop_comment(stripped)
            found.append(ReadmeCommand(f"code block, line {n}", code))
        elif line.startswith("| `xover"):
            first = line.split(" | ", 1)[0].lstrip("| ")
            for span in re.findall(r"`([^`]+)`", first):
                if span.startswith("xover "):
                    found.append(ReadmeCommand(f"command table, line {n}", span.replace("\\|", "|")))
    return found


def _drop_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line)


def _words(synopsis: str) -> list[str | list[str]]:
    """Words, with ``[...]`` groups as lists of words."""
    out: list[str | list[str]] = []
    group: list[str] | None = None
    for word in synopsis.split():
        if group is None and word.startswith("["):
            group = []
            word = word[1:]
        if group is not None:
            closing = word.endswith("]")
            if closing:
                word = word[:-1]
            if word:
                group.append(word)
            if closing:
                out.append(group)
                group = None
        else:
            out.append(word)
    if group is not None:
        raise ValueError(f"unclosed [ in README command {synopsis!r}")
    return out


def variants(command: ReadmeCommand) -> list[Variant]:
    words = _words(command.text)
    assert words[0] == "xover", command
    out: list[Variant] = []
    gpu_groups = [w for w in words if isinstance(w, list) and " ".join(w) in NEEDS_GPU]
    runs: list[tuple[list[str | list[str]], str | None]] = [
        ([w for w in words[1:] if not (isinstance(w, list) and w in gpu_groups)], None)
    ]
    for g in gpu_groups:
        runs.append((words[1:], NEEDS_GPU[" ".join(g)]))
    for chosen, skip in runs:
        flat = [x for w in chosen for x in (w if isinstance(w, list) else [w])]
        choices = [w.split("|") if "|" in w else [w] for w in flat]
        for combo in itertools.product(*choices):
            out.append(Variant(command, tuple(combo), skip))
    return out


@dataclasses.dataclass(frozen=True)
class Substitutions:
    """What the README-commands test changes in a README command, and nothing else.

    * ``-m M`` / ``M.gguf`` (the model) -> ``model``; ``-o q.gguf`` (a file to write) -> ``out/q.gguf``;
    * ``DIR`` and ``-o DIR`` (a study folder) -> ``out/xover-study``, the folder ``ttft``, ``cache`` and
      ``session`` write by default (each command runs with ``out`` as its working directory, so every
      default output folder lands there);
    * ``SPEC.toml`` -> ``spec`` (the smallest study spec), ``--configs N,...`` -> its configuration
      names, ``--skip STAGE,...`` -> ``tune`` (the slowest stage), ``--progress-jsonl F`` -> ``out/progress.jsonl``;
    * ``--workload FILE`` -> ``workload`` (a two-turn workload file); ``-- ARGS`` (llama-bench
      arguments) -> ``-- -ngl 99``;
    * sizes: every prompt length or depth (``--lengths``, ``--depth``, ``--length``) divided by
      ``length_divisor`` (1k -> 64, 32k -> 2048, 32000 -> 2000); ``--turns N`` -> ``turns``;
      ``--ncmoe`` layer counts scaled from the 48 layers of the model the README's examples are
      written for to the tiny model's ``n_layer`` (12 -> 1, 18 -> 2); ``--preset NAME`` of ``synth`` -> ``tiny-moe``.
    """

    model: Path
    out: Path
    spec: Path
    spec_configs: str
    workload: Path
    n_layer: int
    length_divisor: int = 16
    turns: int = 2
    readme_layers: int = 48

    @property
    def study_dir(self) -> Path:
        return self.out / "xover-study"


SIZE_FLAGS = ("--lengths", "--depth", "--length")


def _scale_lengths(value: str, divisor: int) -> str:
    parts = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)([kK]?)", part.strip())
        assert m, f"not a length list: {value!r}"
        tokens = int(m.group(1)) * (1024 if m.group(2) else 1)
        parts.append(str(max(8, tokens // divisor)))
    return ",".join(parts)


def substitute(argv: Sequence[str], s: Substitutions) -> list[str]:
    """``argv`` with placeholders and sizes replaced (see :class:`Substitutions`); raises on an unknown placeholder."""
    out: list[str] = []
    prev = ""
    for word in argv:
        new: list[str]
        if prev in ("-m", "--model") or word in ("M", "M.gguf"):
            new = [str(s.model)]
        elif word == "DIR":
            new = [str(s.study_dir)]
        elif prev in ("-o", "--output") and word.endswith(".gguf"):
            new = [str(s.out / word)]
        elif word == "SPEC.toml":
            new = [str(s.spec)]
        elif prev == "--configs" and word == "N,...":
            new = [s.spec_configs]
        elif prev == "--skip" and word == "STAGE,...":
            new = ["tune"]
        elif prev == "--progress-jsonl" and word == "F":
            new = [str(s.out / "progress.jsonl")]
        elif prev == "--workload" and word == "FILE":
            new = [str(s.workload)]
        elif prev == "--" and word == "ARGS":
            new = ["-ngl", "99"]
        elif prev in SIZE_FLAGS:
            new = [_scale_lengths(word, s.length_divisor)]
        elif prev == "--turns":
            new = [str(s.turns)]
        elif prev == "--ncmoe":
            new = [",".join(str(round(int(v) * s.n_layer / s.readme_layers)) for v in word.split(","))]
        elif prev == "--preset" and argv[0] == "synth":
            new = ["tiny-moe"]
        elif PLACEHOLDER.search(word) and word not in ("-", "--"):
            raise AssertionError(
                f"README placeholder {word!r} (after {prev!r}) has no substitution rule in "
                "tests/readme_commands.py: teach it one"
            )
        else:
            new = [word]
        out += new
        prev = word
    return out


def readme_variants(text: str | None = None) -> list[Variant]:
    """The variants of every command of ``text``, else of every page of :data:`DOCS` (each once, in page order)."""
    if text is not None:
        return [v for c in extract(text) for v in variants(c)]
    found: dict[str, Variant] = {}
    for page in DOCS:
        for c in extract(page.read_text(encoding="utf-8")):
            c = dataclasses.replace(c, source=f"{page.relative_to(ROOT)} {c.source}")
            for v in variants(c):
                found.setdefault(v.id, v)
    return list(found.values())


def describe(v: Variant, argv: Sequence[str]) -> str:
    return f"{v.command.source}: `{v.command.text}` ran as `xover {shlex.join(argv)}`"


def iter_flags(argv: Sequence[str]) -> Iterator[str]:
    for word in argv:
        if word == "--":
            return
        if word.startswith("-") and not re.fullmatch(r"-\d+", word):
            yield word
