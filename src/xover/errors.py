"""The one exception type the CLI turns into a one-line message and a non-zero exit."""

from __future__ import annotations


class XoverError(Exception):
    """A problem the user can fix; the message says what to change."""

    exit_code = 2


class BuildError(XoverError):
    exit_code = 3


class GGUFError(XoverError):
    """A file that is not a readable GGUF (missing, wrong magic, truncated, hostile)."""
