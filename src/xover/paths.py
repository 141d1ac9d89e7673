"""Where xover keeps things on this machine (build cache, downloads)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The per-user cache: ``$XOVER_CACHE_DIR``, else ``$XDG_CACHE_HOME/xover``, else ``~/.cache/xover``."""
    explicit = os.environ.get("XOVER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "xover"
