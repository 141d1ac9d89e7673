"""How token counts and waits are written: the one formatter of each for reports and messages, and the spelling of a
command-line value. Pure."""

from __future__ import annotations


def format_tokens(n: float) -> str:
    """Token counts as llama.cpp users write them: 32768 -> ``32K`` (K = 1024); others in full, ``8,000``."""
    r = round(n)
    if r >= 1024 and r % 1024 == 0:
        return f"{r // 1024}K"
    return f"{r:,}"


def token_arg(n: int) -> str:
    """A token count as a command-line value xover reads back (``--lengths 1k,32k``): ``32k``, else ``1000``."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def format_wait(seconds: float) -> str:
    """Time a user waits, in their units: ``2.5 min`` from a minute on (either sign), else ``12.3 s``."""
    return f"{seconds / 60:.1f} min" if abs(seconds) >= 60 else f"{seconds:.1f} s"
