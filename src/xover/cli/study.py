"""`xover study` (being built)."""

from __future__ import annotations

import click

from xover.errors import XoverError


@click.command(context_settings={"ignore_unknown_options": True})
def study() -> None:
    """(not available yet)"""
    raise XoverError("`xover study` is not available in this version yet")
