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
def ik_bins():
    """ik_llama.cpp's real llama-bench/llama-server: xover's cached CPU build of the ik-llama-cpp-python sdist (built
    on first use; `bash scripts/setup.sh test` builds it before the tests)."""
    from xover.llamacpp import build
    from xover.llamacpp.binaries import Binaries

    manifest = build.build(backend="cpu", engine="ik_llama.cpp")
    bin_dir = Path(manifest.bin_dir)
    return Binaries(
        bench=bin_dir / "llama-bench", server=bin_dir / "llama-server", source="cache", manifest=manifest,
        engine="ik_llama.cpp",
    )  # fmt: skip


@pytest.fixture(scope="session")
def vulkan_bins():
    """Mainline's real Vulkan build (xover's cached one; `bash scripts/setup.sh test` makes it after
    scripts/vulkan-deps.sh), run on Mesa's lavapipe here."""
    from xover.llamacpp import build
    from xover.llamacpp.binaries import Binaries

    manifest = build.build(backend="vulkan")
    bin_dir = Path(manifest.bin_dir)
    return Binaries(
        bench=bin_dir / "llama-bench", server=bin_dir / "llama-server", source="cache", manifest=manifest,
        backend="vulkan",
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny-moe preset, synthesized once per test session."""
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    path = tmp_path_factory.mktemp("models") / "tiny-moe.gguf"
    write_model(PRESETS["tiny-moe"], path, seed=0)
    return path


@pytest.fixture(scope="session")
def fake_bins(tmp_path_factory):
    """A binary folder whose llama-server is the fake server (tests/fakes/llama_server.py) and whose llama-bench
    is a stub: for known answers and injected faults, never in place of the real path."""
    from fakes.llama_server import write_bin_dir
    from xover.llamacpp.binaries import Binaries

    d = write_bin_dir(tmp_path_factory.mktemp("fakebin"))
    return Binaries(bench=d / "llama-bench", server=d / "llama-server", source="--llama-bin-dir")


@pytest.fixture(autouse=True)
def no_tracked_child_left():
    """After every test, no llama process (or fake) that xover started in this process is still running."""
    from xover.llamacpp import process

    yield
    assert process.live_pids() == [], "a process started by a test is still running"


@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory) -> Path:
    """A fake CUDA runtime with known answers (tests/fakes/fake_cudart.c), for the VRAM budget's holder: point
    XOVER_CUDART at it and describe the card with FAKE_CUDA_FREE / _TOTAL / _CONTEXT / _DEVICES / _MAX_ALLOC."""
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("g++")
    if compiler is None:
        pytest.fail("no C compiler (cc, gcc or g++) to build the fake CUDA runtime")
    out = tmp_path_factory.mktemp("cudart") / "libfakecudart.so"
    src = Path(__file__).resolve().parent / "fakes" / "fake_cudart.c"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out
