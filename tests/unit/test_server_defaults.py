"""Issue 66 item 3: which of llama-server's own defaults xover overrides for control, and what they were for the
build, read from that build's ``--help`` (saved here for the pinned llama.cpp 0c1e570 and ik_llama.cpp 0.1.5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xover.domain.config import LlamaConfig
from xover.llamacpp import server
from xover.llamacpp.server import ServerLaunch, help_default, overridden_defaults

HELP = Path(__file__).parents[1] / "fixtures" / "help"
MAINLINE = (HELP / "llama-server-0c1e570.txt").read_text()
IK = (HELP / "ik-llama-server-0.1.5.txt").read_text()


@pytest.mark.parametrize(
    ("help", "flag", "default"),
    [
        (MAINLINE, "-np", "-1"),  # "(default: -1, -1 = auto)": llama-server picks its slots itself
        (MAINLINE, "--parallel", "-1"),  # the long spelling of the same entry
        (MAINLINE, "--cache-ram", "8192"),  # an 8 GiB host-memory prompt cache
        (MAINLINE, "-cram", "8192"),
        (MAINLINE, "-fit", "on"),  # "('on' or 'off', default: 'on')"
        (MAINLINE, "-ub", "512"),
        (MAINLINE, "--swa-checkpoints", "32"),  # the third spelling, on a line too long for the description
        (MAINLINE, "--no-mmap", None),  # an entry with no stated default
        (MAINLINE, "--no-such-flag", None),
        (IK, "-np", "1"),  # ik_llama.cpp: one slot by default, its help indented two spaces
        (IK, "--cache-ram", "8192"),
        (IK, "-fit", None),  # ik_llama.cpp has no fitter
    ],
)
def test_a_builds_default_is_read_from_its_help(help: str, flag: str, default: str | None) -> None:
    assert help_default(help, flag) == default


def test_each_run_records_the_server_defaults_xover_overrode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "help_text", lambda binary: MAINLINE if "ik" not in binary.name else IK)
    cold = ServerLaunch(LlamaConfig("c"), Path("m.gguf"), 4096)
    assert overridden_defaults(cold, Path("llama-server")) == [
        {"flag": "-np", "value": "1", "default": "-1"},
        {"flag": "--cache-ram", "value": "0", "default": "8192"},
        {"flag": "-fit", "value": "off", "default": "on"},
    ]
    args = cold.args()  # and they are what the server is started with
    assert all(args[args.index(o["flag"]) + 1] == o["value"] for o in overridden_defaults(cold, Path("llama-server")))
    # a cache-lab or session mode that keeps llama-server's slots and prompt cache overrides only the fitter
    defaults = ServerLaunch(LlamaConfig("c"), Path("m.gguf"), 4096, cold_cache=False)
    assert overridden_defaults(defaults, Path("llama-server")) == [{"flag": "-fit", "value": "off", "default": "on"}]
    ik = ServerLaunch(LlamaConfig("c", engine="ik_llama.cpp"), Path("m.gguf"), 4096)
    assert overridden_defaults(ik, Path("ik-llama-server")) == [
        {"flag": "-np", "value": "1", "default": "1"},  # ik_llama.cpp's default already: said, not hidden
        {"flag": "--cache-ram", "value": "0", "default": "8192"},
    ]
