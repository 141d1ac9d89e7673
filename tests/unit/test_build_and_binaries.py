"""The llama.cpp build key, source resolution errors and binary resolution order (no compiling)."""

import os
import stat
from pathlib import Path

import pytest

from xover.errors import BuildError, XoverError
from xover.llamacpp import binaries, build


def _fake_bin_dir(d: Path, names: tuple[str, ...] = ("llama-bench", "llama-server")) -> Path:
    d.mkdir(parents=True)
    for name in names:
        p = d / name
        p.write_text("#!/bin/sh\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return d


def test_cmake_args_are_offline_and_stamped():
    args = build.cmake_args_for("cpu", (), build.PINNED.commit, build.PINNED.build_number)
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in args
    assert "-DLLAMA_BUILD_TESTS=OFF" in args and "-DLLAMA_BUILD_EXAMPLES=OFF" in args
    assert f"-DLLAMA_BUILD_COMMIT={build.PINNED.commit[:7]}" in args
    assert "-DGGML_RPC=ON" in args  # --rpc in llama-bench/llama-server and the ggml-rpc-server target
    assert "ggml-rpc-server" in build.TARGETS and "llama-server" in build.TARGETS
    cuda = build.cmake_args_for("cuda", ("-DCMAKE_CUDA_ARCHITECTURES=90",), build.PINNED.commit, 0)
    assert "-DGGML_CUDA=ON" in cuda and cuda[-1] == "-DCMAKE_CUDA_ARCHITECTURES=90"
    assert "-DGGML_RPC=ON" in cuda


def test_which_lists_the_rpc_server(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    d = _fake_bin_dir(tmp_path / "bin")
    got = binaries.resolve(d)
    assert got.rpc_server is None
    assert "rpc-server:   none (ggml-rpc-server not built: -DGGML_RPC=ON)" in got.describe()
    rpc = d / "ggml-rpc-server"
    rpc.write_text("#!/bin/sh\n")
    rpc.chmod(rpc.stat().st_mode | stat.S_IXUSR)
    assert got.rpc_server == rpc
    assert f"rpc-server:   {rpc}" in got.describe()


def test_key_depends_on_backend_and_flags():
    c = build.PINNED.commit
    a = build.build_key(c, "cpu", build.cmake_args_for("cpu", (), c, 0))
    b = build.build_key(c, "cpu", build.cmake_args_for("cpu", ("-DGGML_NATIVE=OFF",), c, 0))
    d = build.build_key(c, "cuda", build.cmake_args_for("cuda", (), c, 0))
    assert a.startswith(c[:7] + "-cpu-")
    assert len({a, b, d}) == 3
    assert a == build.build_key(c, "cpu", build.cmake_args_for("cpu", (), c, 0))


def test_unknown_backend_is_one_line_error():
    with pytest.raises(BuildError, match="unknown backend 'opencl'"):
        build.cmake_args_for("opencl", (), "unknown", 0)


def test_source_errors(tmp_path):
    with pytest.raises(BuildError, match="does not exist"):
        build.resolve_source(tmp_path / "nope", tmp_path, print)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BuildError, match="not a llama.cpp tree"):
        build.resolve_source(tmp_path / "empty", tmp_path, print)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(BuildError, match="not a readable"):
        build.resolve_source(bad, tmp_path, print)


def test_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("XOVER_CACHE_DIR", str(tmp_path / "cache"))
    flag_dir = _fake_bin_dir(tmp_path / "flag")
    env_dir = _fake_bin_dir(tmp_path / "env")
    path_dir = _fake_bin_dir(tmp_path / "path")
    monkeypatch.setenv("PATH", f"{path_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(binaries.ENV_VAR, str(env_dir))
    assert binaries.resolve(flag_dir).source == "--llama-bin-dir"
    assert binaries.resolve().server == (env_dir / "llama-server").resolve()
    monkeypatch.delenv(binaries.ENV_VAR)
    assert binaries.resolve().source == "PATH"  # empty cache: falls through to PATH
    # a cached build wins over PATH
    key = "0c1e570-cpu-deadbeef"
    cached = _fake_bin_dir(tmp_path / "cache" / "builds" / key / "build" / "bin", build.TARGETS)
    manifest = build.BuildManifest(
        key=key,
        backend="cpu",
        commit=build.PINNED.commit,
        build_number=0,
        origin="test",
        cmake_args=(),
        bin_dir=str(cached),
        built_at="2026-01-01T00:00:00+0000",
        build_seconds=1.0,
    )
    (tmp_path / "cache" / "builds" / key / "manifest.json").write_text(manifest.to_json())
    got = binaries.resolve()
    assert got.source == "cache" and got.manifest == manifest
    assert "xover build cache" in got.describe()


def test_missing_binaries_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("XOVER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(binaries.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(XoverError, match="xover llama build"):
        binaries.resolve()
    (tmp_path / "half").mkdir()
    with pytest.raises(XoverError, match="no executable llama-bench or llama-server"):
        binaries.resolve(tmp_path / "half")


def test_cpu_build_leaves_out_amx_on_x86_only(monkeypatch: pytest.MonkeyPatch):
    """A VM that advertises AMX but traps it kills every llama-bench run of a native CPU build (SIGILL)."""
    c = build.PINNED.commit
    monkeypatch.setattr(build.platform, "machine", lambda: "x86_64")
    cpu = build.cmake_args_for("cpu", (), c, 0)
    assert "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in cpu
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" in cpu
    assert not any("amx" in a for a in build.cmake_args_for("cuda", (), c, 0))  # GPU builds keep llama.cpp's flags
    monkeypatch.setattr(build.platform, "machine", lambda: "aarch64")
    assert not any("amx" in a for a in build.cmake_args_for("cpu", (), c, 0))
