"""Strings xover did not write (paths, GGUF metadata, server answers) made inert for a terminal. Pure.

A GGUF's ``general.name``, a tensor name or a file name can hold anything: an escape sequence that
recolours, clears or retitles the terminal, a carriage return that overwrites the line it is on, a
bidirectional override that reorders what follows. :func:`visible` spells every such character out
(``\\x1b``, ``\\r``, ``\\u202e``) so what reaches the terminal is the string's content, never an
instruction to the terminal. Escaping rich's markup (``[bold]`` in a file name) is
:func:`xover.console.safe`'s job, on top of this.
"""

from __future__ import annotations

import unicodedata

# Characters that change how the rest of a line is displayed without being control characters
# (Unicode category Cf): bidirectional embeddings, overrides and isolates, and the marks.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _spelled(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def is_unsafe(ch: str, keep_newlines: bool = False) -> bool:
    """Whether ``ch`` is a control character (C0, DEL, C1) or a bidirectional control."""
    if keep_newlines and ch in "\n\t":
        return False
    return unicodedata.category(ch) == "Cc" or ch in _BIDI


def visible(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control character and bidirectional control spelled out as ``\\xNN`` /
    ``\\uNNNN``; with ``keep_newlines``, newlines and tabs stay (for multi-line text xover wrote)."""
    if not any(is_unsafe(ch, keep_newlines) for ch in text):
        return text
    return "".join(_spelled(ch) if is_unsafe(ch, keep_newlines) else ch for ch in text)
