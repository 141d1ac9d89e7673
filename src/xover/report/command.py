"""The report's block on a configuration given as the user's own command line (``--baseline``, ``[[config]]
command``): the command as given, what xover ran of it, and what it passed through or replaced (issue 67)."""

from __future__ import annotations

import shlex

from xover.domain.command_line import UserCommand, diff, listed, parse_command
from xover.domain.config import LlamaConfig
from xover.errors import XoverError
from xover.report.blocks import Block
from xover.results.read_model import StudyData

TITLE = "Your command"
TUNED = " tuned"  # a tuned variant's name: its base's and this (measure.tune.SUFFIX)


def command_blocks(data: StudyData) -> list[Block]:
    """One list per such configuration; nothing for a study without one."""
    record = data.study_record()
    if record is None or not record.commands:
        return []
    engines = {c.name: c.engine for c in data.configs}
    out = [
        Block("h2", TITLE),
        Block(
            "p",
            "Measured as a configuration of its own, in the same rounds of fresh servers as the others: the flags "
            "xover's option table knows became its settings (checked, spelled as llama-server takes them), the model "
            "and -c are the study's (sized for its prompts), and llama-server's slots, host prompt cache and fit are "
            "xover's controlled ones (-np 1 --cache-ram 0 -fit off) unless the command sets them.",
        ),
    ]
    for name, text in record.commands:
        try:
            cmd = parse_command(text, engines.get(name, "llama.cpp"), where=name)
        except XoverError as e:  # a store written by another version of the reader
            out.append(Block("ul", items=(f"{name}: {text} (not read here: {e})",)))
            continue
        ran = shlex.join(cmd.config(name).server_argv()) or "(no flags: llama-server's defaults)"
        out.append(Block("ul", items=(f"{name}, as given: {text}", f"as measured: {ran}", *listed(cmd))))
        tuned = next((c for c in data.configs if c.name == f"{name}{TUNED}"), None)
        if tuned is not None:
            out += _what_to_change(name, cmd, tuned)
    return out


def _what_to_change(name: str, cmd: UserCommand, tuned: LlamaConfig) -> list[Block]:
    """The tuned variant of the command as a diff against it, then the whole command (the verdicts above say
    whether the tuned variant is faster in the rounds)."""
    d = diff(cmd, tuned)
    if d.empty:
        return [Block("p", f"What to change: nothing. The tuning stage kept {name} as it is.")]
    items = [*(f"add {f}" for f in d.added), *(f"change {f}" for f in d.changed), *(f"remove {f}" for f in d.removed)]
    return [
        Block("p", f"What to change to run {tuned.name} (the verdicts above say whether it is faster here):"),
        Block("ul", items=tuple(items)),
        Block("code", d.command),
    ]
