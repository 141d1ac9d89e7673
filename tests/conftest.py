"""Shared fixtures: the real llama.cpp binaries (built by xover itself) and a tiny synthetic model."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_bins():
    """The real llama-bench/llama-server: xover's cached CPU build (built on first use)."""
    from xover.llamacpp import build
    from xover.llamacpp.binaries import Binaries

    manifest = build.build(backend="cpu")
    bin_dir = Path(manifest.bin_dir)
    return Binaries(bench=bin_dir / "llama-bench", server=bin_dir / "llama-server", source="cache", manifest=manifest)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny-moe preset, synthesized once per test session."""
    from xover.gguf.presets import PRESETS
    from xover.gguf.synth import write_model

    path = tmp_path_factory.mktemp("models") / "tiny-moe.gguf"
    write_model(PRESETS["tiny-moe"], path, seed=0)
    return path
