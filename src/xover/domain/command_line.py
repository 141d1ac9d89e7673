"""A user's own llama-server command line, read through the option table (issue 67). Pure.

Users who tune have a command of their own (``llama-server -m model.gguf -ngl 99 --n-cpu-moe 20 -c 32768 -ub 2048``)
and the question they bring is how much faster than that. :func:`parse_command` reads such a line:

- the options the table knows (:mod:`xover.domain.llama_options`) become a configuration's settings, each value
  checked as a spec's would be (``-ub abc`` is refused, naming the flag); ``--flag=value`` is ``--flag value``; a list
  option given again (``-ot a=CPU -ot b=CPU``) adds to its list;
- the model (``-m``) and the context (``-c``) are kept apart: the study measures its own model and sizes ``-c`` for
  its prompts, and says so;
- flags xover must own to run and measure the server (``--port``, ``--host``, ``--log-file``) are replaced, and
  listed as such;
- any other flag, and what follows it up to the next flag, is passed through verbatim, and listed;
- a flag the table knows for another engine only (ik_llama.cpp's ``-fmoe`` on mainline) is refused before anything
  runs, as is a command with no model or with unbalanced quotes: one line that names what to change.

:meth:`UserCommand.argv` prints the command back in the table's spellings: reading that again gives the same command.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Sequence

from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.errors import XoverError

OWNED = ("--port", "--host", "--log-file")
"""Flags xover sets itself to start, reach and log the server: a user's value is replaced."""
MODEL = ("-m", "--model")
CONTEXT = ("-c", "--ctx-size")
BASELINE = "yours"  # the configuration's name in a study


@dataclasses.dataclass(frozen=True)
class UserCommand:
    """A command line as read: its binary (None where the line starts with a flag), model, context, the settings the
    table knows, what passes through verbatim, and the owned flags (with their values) that xover replaces."""

    binary: str | None
    model: str
    ctx_size: int | None
    settings: tuple[tuple[str, str], ...]
    passthrough: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    engine: str = opts.ENGINE

    def config(self, name: str = BASELINE, backend: str | None = None) -> LlamaConfig:
        """The configuration a study measures for it (its model and ``-c`` are the study's)."""
        return LlamaConfig(name, self.settings, engine=self.engine, backend=backend, server_args=self.passthrough)

    def argv(self) -> tuple[str, ...]:
        """The command back, in the table's spellings (the binary first where the line had one)."""
        head = (self.binary,) if self.binary else ()
        ctx = ("-c", str(self.ctx_size)) if self.ctx_size is not None else ()
        return (*head, "-m", self.model, *ctx, *self.config().server_argv(), *self.replaced)

    def text(self) -> str:
        return shlex.join(self.argv())


def split_command(text: str, where: str = "--baseline") -> list[str]:
    """The words of a command line as a shell splits them (quotes kept together), ``--flag=value`` split in two."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise XoverError(f"{where}: cannot read the command ({e}): check its quotes") from None
    out: list[str] = []
    for w in words:
        if w.startswith("--") and "=" in w:
            flag, value = w.split("=", 1)
            out += [flag, value]
        else:
            out.append(w)
    return out


def _flag(word: str) -> bool:
    """A word that is a flag, not a value (``-1`` and ``-0.5`` are values)."""
    return word.startswith("-") and len(word) > 1 and not word[1].isdigit() and word[1] != "."


def _known(word: str, engine: str, where: str) -> opts.LlamaOption | None:
    """The table's option this llama-server flag sets, as ``engine`` takes it; a flag the table knows only for
    another engine is refused."""
    options = [o for o in opts.OPTIONS if not o.env]
    for o in (o.for_engine(engine) for o in options if engine in o.engines):
        if word in (*o.server, *o.server_off):
            return o
    for o in options:
        others = [e for e in o.engines if e != engine]
        if any(word in (*f.server, *f.server_off) for f in (o.for_engine(e) for e in others)):
            raise XoverError(
                f"{where}: {word} is a flag of {', '.join(others)}'s llama-server, not {engine}'s: drop it, or "
                f"measure the command on {others[0]}"
            )
    return None


def parse_command(text: str, engine: str = opts.ENGINE, where: str = "--baseline") -> UserCommand:
    """``text`` read as described in the module's doc, or a one-line error naming the flag to change."""
    words = split_command(text, where)
    if not words:
        raise XoverError(f'{where}: give a llama-server command, e.g. "llama-server -m model.gguf -ngl 99"')
    binary = None if _flag(words[0]) else words[0]
    rest = words[1:] if binary is not None else words
    if binary is not None and not binary.rsplit("/", 1)[-1].startswith("llama-server"):
        raise XoverError(f"{where}: {binary!r} is not llama-server: give the command that starts your llama-server")
    model: str | None = None
    ctx: int | None = None
    settings: dict[str, str] = {}
    passthrough: list[str] = []
    replaced: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) and not _flag(rest[i + 1]) else None
        if not _flag(word):
            raise XoverError(f"{where}: {word!r} follows no flag: quote a value that holds spaces")
        option = _known(word, engine, where)
        if word in MODEL or word in CONTEXT or word in OWNED or (option is not None and option.kind != "switch"):
            if value is None:
                raise XoverError(f"{where}: {word} needs a value")
            i += 2
        else:
            i += 1
        if word in MODEL:
            model = value
        elif word in CONTEXT:
            ctx = _tokens(value, f"{where} {word}")
        elif word in OWNED:
            replaced += [word, str(value)]
        elif option is None:  # passed through: the flag and the values after it
            passthrough.append(word)
            while i < len(rest) and not _flag(rest[i]):
                passthrough.append(rest[i])
                i += 1
        elif option.kind == "switch":
            settings[option.name] = "0" if word in option.server_off else "1"
        else:
            parsed = option.parse(value, f"{where} {word}")
            if option.kind == "list" and option.name in settings:
                parsed = f"{settings[option.name]},{parsed}"
            settings[option.name] = parsed
    if model is None:
        raise XoverError(f"{where}: the command names no model: add -m FILE.gguf")
    ordered = tuple(sorted(settings.items(), key=lambda kv: opts.order(kv[0])))
    return UserCommand(binary, model, ctx, ordered, tuple(passthrough), tuple(replaced), engine)


def _tokens(value: str | None, where: str) -> int:
    if value is None or not value.isdigit():
        raise XoverError(f"{where}: give a number of tokens, got {value!r}")
    return int(value)


def listed(command: UserCommand) -> Sequence[str]:
    """What the report says about a command besides its settings: what passed through, what xover replaced, and
    that the study's own model and context are used."""
    out = [f"the study's model and -c (your {shlex.join(['-m', command.model])}"
           + (f" -c {command.ctx_size}" if command.ctx_size is not None else "") + ")"]  # fmt: skip
    if command.passthrough:
        out.append(f"passed through as given: {shlex.join(command.passthrough)}")
    if command.replaced:
        out.append(f"replaced by xover's own: {shlex.join(command.replaced)}")
    return out


@dataclasses.dataclass(frozen=True)
class CommandDiff:
    """What to change in a command to run another configuration: flags added, removed and changed (each as
    llama-server takes it), and the whole command, ready to paste."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    command: str

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(command: UserCommand, target: LlamaConfig) -> CommandDiff:
    """``command`` changed into ``target`` (a configuration of the same engine: its settings and pass-through
    arguments), keeping the command's model, context and binary."""
    before, after = dict(command.settings), dict(target.settings)

    def flags(name: str, value: str) -> str:
        return shlex.join(opts.BY_NAME[name].for_engine(command.engine).server_args(value)) or f"{name}={value}"

    added = tuple(flags(n, v) for n, v in after.items() if n not in before)
    removed = tuple(flags(n, v) for n, v in before.items() if n not in after)
    changed = tuple(
        f"{flags(n, before[n])} -> {flags(n, v)}" for n, v in after.items() if n in before and before[n] != v
    )
    moved = dataclasses.replace(command, settings=tuple(sorted(after.items(), key=lambda kv: opts.order(kv[0]))),
                                passthrough=target.server_args)  # fmt: skip
    return CommandDiff(added, removed, changed, shlex.join(moved.argv()))
