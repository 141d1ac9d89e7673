"""`xover bench` (being built)."""

from __future__ import annotations

import click

from xover.errors import XoverError


@click.command(context_settings={"ignore_unknown_options": True})
def bench() -> None:
    """(not available yet)"""
    raise XoverError("`xover bench` is not available in this version yet")
