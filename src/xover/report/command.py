"""The report's block on a configuration given as the user's own command line (``--baseline``, ``[[config]]
command``): the command as given, what xover ran of it, and what it passed through or replaced (issue 67)."""

from __future__ import annotations

import shlex

from xover.domain.command_line import listed, parse_command
from xover.errors import XoverError
from xover.report.blocks import Block
from xover.results.read_model import StudyData

TITLE = "Your command"


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
    return out
