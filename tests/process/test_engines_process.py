"""The tests of tests/unit/test_engines.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

from pathlib import Path


def test_each_engines_folder_is_given_on_the_command_line_and_a_wrong_one_is_a_one_line_error(
    tmp_path: Path, fake_bins
) -> None:
    """``--llama-bin-dir ik_llama.cpp=DIR`` names ik_llama.cpp's folder beside mainline's; a configuration on that
    engine gets those binaries. An unknown engine, a folder twice, or a folder without the binaries: one line, exit
    non-zero, before anything runs."""
    from procs import one_line_error, run_xover
    from xover.llamacpp.binaries import resolve_chosen

    ik_dir = fake_bins.bin_dir
    b = resolve_chosen({"llama.cpp": fake_bins.bin_dir, "ik_llama.cpp": ik_dir})
    ik = b.for_build("ik_llama.cpp")
    assert ik.engine == "ik_llama.cpp" and ik.bin_dir == ik_dir and ik.source == "--llama-bin-dir"
    assert ik.for_build("llama.cpp").bin_dir == fake_bins.bin_dir  # and back, the chosen folders kept
    spec = tmp_path / "s.toml"
    spec.write_text('[model]\npreset = "tiny-moe"\n[[config]]\nname = "a"\n')
    study = ("study", str(spec), "-o", str(tmp_path / "o"), "--llama-bin-dir")
    one_line_error(
        run_xover(*study, "vllm=/x"),
        "'vllm' names no build: use an engine (llama.cpp, ik_llama.cpp), a backend (cpu, cuda, vulkan, hip, metal) or "
        "ENGINE:BACKEND, or a bare DIR",
    )
    one_line_error(
        run_xover(*study, f"ik_llama.cpp={tmp_path}"),
        f"{tmp_path} (--llama-bin-dir) has no executable llama-bench or llama-server",
    )
    one_line_error(
        run_xover(*study, "ik_llama.cpp=/a", "--llama-bin-dir", "ik_llama.cpp=/b"), "ik_llama.cpp is given twice"
    )
