"""`xover ttft` (being built)."""

from __future__ import annotations

import click

from xover.errors import XoverError


@click.command(context_settings={"ignore_unknown_options": True})
def ttft() -> None:
    """(not available yet)"""
    raise XoverError("`xover ttft` is not available in this version yet")
