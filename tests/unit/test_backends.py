"""A build is engine + backend (issue 45): known answers for the backend's checks, the option table's backends,
a folder's backend, the dependency checks and a configuration's key. The real path (a Vulkan build on lavapipe,
one without a device) is tests/real/test_backends_real.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xover.analysis import advise
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import config_from_table
from xover.errors import BuildError, XoverError
from xover.llamacpp import build
from xover.llamacpp.bench import record_mismatch
from xover.llamacpp.binaries import parse_build_name, resolve_build
from xover.llamacpp.server import logged_devices


def test_the_backend_a_record_ran_on_is_read_from_backends_and_its_devices() -> None:
    # a Vulkan build that found no device registers the backend with none: gpu_info is empty, so it ran on the CPU
    assert opts.ran_on_bench("Vulkan", "") == ()
    assert opts.ran_on_bench("Vulkan", "NVIDIA H200") == ("Vulkan",)
    assert opts.ran_on_bench("CUDA,RPC", "NVIDIA H200") == ("CUDA",)
    assert opts.ran_on_bench("CPU", "") == ()
    assert opts.ran_on_server(["Vulkan0", "RPC0[127.0.0.1:50052]"]) == ("Vulkan",)
    assert (
        opts.backend_of("CUDA,RPC") == "cuda" and opts.backend_of("ROCm") == "hip" and opts.backend_of("CPU") == "cpu"
    )
    assert opts.backend_of("SYCL") is None  # a backend xover does not build


def test_a_gpu_build_that_ran_on_the_cpu_is_a_one_line_problem_naming_the_cause() -> None:
    problem = opts.backend_problem("vulkan", (), "llama-bench")
    assert problem is not None and "\n" not in problem
    assert problem.startswith("llama-bench of the vulkan build ran on the CPU: no Vulkan device found")
    assert "ICD or a loader library is missing" in problem
    assert opts.backend_problem("vulkan", ("Vulkan",), "llama-bench") is None
    assert "ran on CUDA, not Vulkan" in (opts.backend_problem("vulkan", ("CUDA",), "llama-server") or "")
    assert opts.backend_problem("cpu", (), "llama-bench") is None
    assert "cpu configuration ran on CUDA" in (opts.backend_problem("cpu", ("CUDA",), "llama-bench") or "")
    assert opts.backend_problem(None, (), "llama-bench") is None  # the build's backend unknown: nothing to check


def test_every_llama_bench_record_is_checked_against_its_builds_backend() -> None:
    config = LlamaConfig("vk", backend="vulkan")
    fell_back = {"backends": "Vulkan", "gpu_info": "", "n_ubatch": 512}
    assert "ran on the CPU" in (record_mismatch(config, fell_back, "vulkan") or "")
    assert record_mismatch(config, {**fell_back, "gpu_info": "llvmpipe (LLVM 15.0.6, 256 bits)"}, "vulkan") is None
    # no backend known (a user's static build): the option checks alone, as before
    assert record_mismatch(LlamaConfig("x"), fell_back, None) is None


def test_a_servers_devices_are_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "ggml_vulkan: Found 1 Vulkan devices:\n"
        "llama_model_load_from_file_impl: using device Vulkan0 (llvmpipe (LLVM 15.0.6, 256 bits)) (unknown id) - "
        "23983 MiB free\nload_tensors: offloaded 5/5 layers to GPU\n"
    )
    assert logged_devices(log) == (("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)"),)
    (tmp_path / "cpu.log").write_text("load_tensors: offloaded 0/5 layers to GPU\n")
    assert logged_devices(tmp_path / "cpu.log") == ()


def test_the_option_table_knows_the_backends_each_option_acts_on() -> None:
    assert opts.NO_HOST.acts_on("cuda") and opts.NO_HOST.acts_on("vulkan") and not opts.NO_HOST.acts_on("metal")
    assert opts.NO_OP_OFFLOAD.acts_on("metal") and not opts.NO_OP_OFFLOAD.acts_on("cpu")
    assert opts.VK_VISIBLE_DEVICES.acts_on("vulkan") and not opts.VK_VISIBLE_DEVICES.acts_on("cuda")
    assert opts.CUDA_DISABLE_GRAPHS.acts_on("cuda") and not opts.CUDA_DISABLE_GRAPHS.acts_on("vulkan")
    assert opts.LOAD_MODE.acts_on("vulkan") and not opts.LOAD_MODE.acts_on("cpu")  # gpu_only: every GPU backend
    assert opts.UBATCH_SIZE.acts_on("cpu") and opts.FLASH_ATTN.acts_on("vulkan")
    # a configuration built for a backend an option cannot act on is refused in one line, naming both
    with pytest.raises(XoverError, match=r"GGML_VK_VISIBLE_DEVICES acts only on vulkan builds, not cuda"):
        LlamaConfig("c", (("GGML_VK_VISIBLE_DEVICES", "0"),), backend="cuda")
    with pytest.raises(XoverError, match=r"no-host acts only on cuda, hip, vulkan builds, not cpu"):
        config_from_table({"name": "c", "backend": "cpu", "no-host": True}, 0)
    with pytest.raises(XoverError, match=r"backend must be one of cpu, cuda, vulkan, hip, metal, got 'opencl'"):
        config_from_table({"name": "c", "backend": "opencl"}, 0)
    # a configuration of the engine's default build (no backend) is not checked: its build's backend is not known
    assert LlamaConfig("d", (("no-host", "1"),)).get("no-host") == "1"


def test_the_tuning_stage_skips_a_knob_of_another_backend_with_its_reason() -> None:
    ctx = advise.Context(gpu_build=True, backend="metal")
    assert advise.skip_reason("no-host", ctx) == "it acts only on cuda, hip, vulkan builds, not metal"
    assert advise.skip_reason("ubatch-size", ctx) is None
    assert advise.backend_reason("GGML_OP_OFFLOAD_MIN_BATCH", "vulkan") is None
    # a CPU build keeps its own reason, as before
    assert advise.skip_reason("no-op-offload", advise.Context(gpu_build=False, backend="cpu")) == (
        "a CPU-only build copies no weights to a GPU"
    )


def test_a_presence_read_variable_is_set_when_on_and_left_unset_when_off() -> None:
    on = LlamaConfig("v", (("GGML_VK_DISABLE_COOPMAT2", "1"),), backend="vulkan")
    off = LlamaConfig("v", (("GGML_VK_DISABLE_COOPMAT2", "0"),), backend="vulkan")
    assert on.environment() == (("GGML_VK_DISABLE_COOPMAT2", "1"),)
    assert off.environment() == ()  # ggml reads getenv(...) != nullptr: "0" would disable it too


def test_a_configuration_of_the_default_build_keeps_its_key_and_a_backend_makes_another() -> None:
    plain = LlamaConfig("a", (("n-cpu-moe", "12"),))
    assert "backend" not in plain.identity()  # stores written before backends keep their keys
    assert plain.key == "b0ae84612e54d11e"  # as before backends (computed on the parent commit)
    cuda = LlamaConfig("a", (("n-cpu-moe", "12"),), backend="cuda")
    vulkan = LlamaConfig("a", (("n-cpu-moe", "12"),), backend="vulkan")
    assert len({plain.key, cuda.key, vulkan.key}) == 3
    assert cuda.build == ("llama.cpp", "cuda") and plain.build == ("llama.cpp", None)


def test_a_build_is_named_by_engine_backend_or_both() -> None:
    assert parse_build_name("vulkan") == ("llama.cpp", "vulkan")
    assert parse_build_name("ik_llama.cpp:cuda") == ("ik_llama.cpp", "cuda")
    assert parse_build_name("llama.cpp") == ("llama.cpp", None)
    assert opts.build_name("llama.cpp", "hip") == "llama.cpp:hip"
    with pytest.raises(XoverError, match="names no build"):
        parse_build_name("llama.cpp:opencl")


def _bin_dir(path: Path, library: str | None) -> Path:
    path.mkdir(parents=True)
    for tool in ("llama-bench", "llama-server"):
        (path / tool).write_text("#!/bin/sh\n")
        (path / tool).chmod(0o755)
    (path / "libggml-base.so").write_text("")
    if library:
        (path / f"{library}.so").write_text("")
    return path


def test_a_folders_backend_is_read_from_the_ggml_library_beside_its_binaries(tmp_path: Path, monkeypatch) -> None:
    vk, cpu = _bin_dir(tmp_path / "vk", "libggml-vulkan"), _bin_dir(tmp_path / "cpu", None)
    assert build.backend_of_dir(vk) == "vulkan" and build.backend_of_dir(cpu) == "cpu"
    monkeypatch.setenv("XOVER_CACHE_DIR", str(tmp_path / "cache"))  # no cached builds
    monkeypatch.delenv("XOVER_LLAMA_BIN_DIR", raising=False)
    chosen = {"llama.cpp": cpu, "vulkan": vk}
    assert resolve_build(chosen, "llama.cpp", "vulkan").bin_dir == vk.resolve()
    assert resolve_build(chosen, "llama.cpp", "cpu").bin_dir == cpu.resolve()
    assert resolve_build(chosen, "llama.cpp", None).bin_dir == cpu.resolve()
    # the engine's variable is taken only for a backend it was built for
    monkeypatch.setenv("XOVER_LLAMA_BIN_DIR", str(cpu))
    assert resolve_build({}, "llama.cpp", "cpu").bin_dir == cpu.resolve()
    with pytest.raises(XoverError, match=r"no llama.cpp vulkan build found: run `xover llama build --backend vulkan`"):
        resolve_build({}, "llama.cpp", "vulkan")


def _headers(root: Path, version: int, layer_settings: bool) -> Path:
    inc = root / "usr" / "include"
    (inc / "vulkan").mkdir(parents=True)
    text = f"#define VK_HEADER_VERSION {version}\n#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n"
    if layer_settings:
        text += "#define VK_EXT_layer_settings 1\n"
    (inc / "vulkan" / "vulkan_core.h").write_text(text)
    (inc / "vulkan" / "vulkan.hpp").write_text("")
    return inc


def test_a_vulkan_build_refuses_headers_too_old_for_the_pinned_llama_cpp_in_one_line(tmp_path: Path) -> None:
    old = _headers(tmp_path / "old", 239, False)  # Debian 12's
    new = _headers(tmp_path / "new", 309, True)
    assert build._vk_headers_ok(old) == (239, False) and build._vk_headers_ok(new) == (309, True)
    glslc = tmp_path / "glslc"
    glslc.write_text("")
    lib = tmp_path / "libvulkan.so"
    lib.write_text("")
    spirv = tmp_path / "spirv"
    spirv.mkdir()
    (spirv / "SPIRV-HeadersConfig.cmake").write_text("")
    given = (f"-DVulkan_GLSLC_EXECUTABLE={glslc}", f"-DVulkan_LIBRARY={lib}", f"-DSPIRV-Headers_DIR={spirv}")
    assert build._vulkan_needs((*given, f"-DVulkan_INCLUDE_DIR={new}")) == []
    with pytest.raises(BuildError) as e:
        build.check_dependencies("vulkan", (*given, f"-DVulkan_INCLUDE_DIR={old}"))
    assert "\n" not in str(e.value) and "Vulkan headers 1.3.261 or newer, with VK_EXT_layer_settings" in str(e.value)
    missing = build._vulkan_needs(
        (f"-DVulkan_GLSLC_EXECUTABLE={tmp_path / 'none'}", f"-DVulkan_INCLUDE_DIR={tmp_path}")
    )
    assert missing[:2] == [
        "glslc (Debian: glslc)",
        f"the Vulkan headers with vulkan.hpp in {tmp_path} (Debian: libvulkan-dev)",
    ]


def test_the_headers_the_set_up_fetched_are_taken_where_the_systems_are_too_old(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("VULKAN_SDK", str(tmp_path / "sdk"))  # the "system's": none
    assert build.vulkan_include_dir(tmp_path / "cache") is None
    fetched = _headers(tmp_path / "cache" / "deps" / build.VK_HEADERS_DEP, 309, True)
    assert build.vulkan_include_dir(tmp_path / "cache") == fetched


def test_a_hip_build_says_what_rocm_lacks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError) as e:
        build.check_dependencies("hip", ())
    assert str(e.value) == (
        f"the hip build needs hipcc (ROCm; looked on PATH and in {tmp_path}/bin: set ROCM_PATH); hipBLAS "
        f"({tmp_path}/lib/libhipblas.so); rocBLAS ({tmp_path}/lib/librocblas.so): install them and retry"
    )
    assert os.environ["ROCM_PATH"] == str(tmp_path)


def test_every_server_is_warmed_through_its_prompt_path_then_at_its_shortest_length() -> None:
    """Issue 66: after an 8-token warm-up a server's first measured prompt paid one-time costs (1.4-2.2x the same
    prompt later, H200; about 1.4x on 2 CPU cores). Every backend's server now prefills its largest ubatch
    (``min(-ub, -b)``), then the shortest length it measures, both discarded.

    ggml_vulkan also compiles a pipeline the first time a shape runs: on the H200 a fresh Vulkan server's first cold
    1K prompt took 24.7 s after an 8-token warm-up (1.3 s in the next round), and 6.4 s after a 576-token one
    (0.14 s later: flash attention's kernels change at 1,024 and 4,096 positions). Its first warm-up prefills a
    whole ubatch and more, past 4,096 positions. The context caps both, less room for the answer."""
    from xover.measure.server_session import warmup_lengths

    assert warmup_lengths(LlamaConfig("c", backend="cuda"), "cuda", 40000, 1024) == (512, 1024)
    assert warmup_lengths(LlamaConfig("c"), None, 40000, None) == (512,)
    assert warmup_lengths(LlamaConfig("c"), None, 40000, 512) == (512,)  # the shortest is the ubatch: once
    wide = LlamaConfig("c", (("ubatch-size", "4096"), ("batch-size", "4096")), backend="cuda")
    assert warmup_lengths(wide, "cuda", 40000, 1024) == (4096, 1024)
    clamped = LlamaConfig("c", (("ubatch-size", "4096"),), backend="cuda")  # -b 2048 runs 2048-token ubatches
    assert warmup_lengths(clamped, "cuda", 40000, 1024) == (2048, 1024)
    assert warmup_lengths(LlamaConfig("c"), None, 300, 128) == (300 - 8, 128)  # within the context
    assert warmup_lengths(LlamaConfig("v", backend="vulkan"), "vulkan", 40000, 1024) == (4096 + 64, 1024)
    big = LlamaConfig("v", (("ubatch-size", "8192"),), backend="vulkan")
    assert warmup_lengths(big, "vulkan", 40000, None) == (8192 + 64,)  # a whole ubatch, past the positions
    tuned = LlamaConfig("v", (("ubatch-size", "4096"),), backend="vulkan")
    assert warmup_lengths(tuned, "vulkan", 1000, 512) == (1000 - 8, 512)  # within the context, room for the answer
    assert warmup_lengths(LlamaConfig("v", backend="vulkan"), "vulkan", 2048, None) == (2048 - 8,)


def test_one_list_of_backends_for_the_table_the_builds_and_the_command() -> None:
    """The backend names live in the option table (BACKEND_TRAITS); the build sources and `xover llama build
    --backend` offer exactly those, so a new backend is one entry in each table, never a third list to edit."""
    import click

    from xover.cli.llama import build as build_command
    from xover.domain.llama_options import BACKENDS
    from xover.llamacpp.build import BACKENDS as BUILT

    assert set(BUILT) == set(BACKENDS)
    (choice,) = [p.type for p in build_command.params if p.name == "backend"]
    assert isinstance(choice, click.Choice) and tuple(choice.choices) == BACKENDS
