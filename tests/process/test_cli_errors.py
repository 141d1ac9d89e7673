"""Bad input gets one line on stderr that says what to change, a non-zero exit, and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from procs import one_line_error, run_xover


def test_inspect_bad_files(tmp_path: Path) -> None:
    one_line_error(run_xover("inspect", str(tmp_path / "missing.gguf")), "no such file")
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a model\n")
    one_line_error(run_xover("inspect", str(text)), "not a GGUF file")
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    model = write_model(PRESETS["tiny-moe"], tmp_path / "tiny.gguf").path
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[: 64 * 1024])
    one_line_error(run_xover("inspect", str(cut)), "truncated")


@pytest.mark.parametrize(
    "args, needle",
    [
        (("synth", "--preset", "nope"), "unknown model preset"),
        (("synth", "--set", "n_layer=x"), "n_layer takes an integer"),
        (("report", "/nonexistent/study"), "holds no results.sqlite"),
        (("study", "/nonexistent/spec.toml"), "cannot read study spec"),
        (("llama", "build", "--source", "/nonexistent/src"), "does not exist"),
    ],
)
def test_invalid_options(args: tuple[str, ...], needle: str) -> None:
    one_line_error(run_xover(*args), needle)


def test_malformed_spec(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('[model]\npreset = "tiny-moe"\n[[config]]\nname = "a"\nn-cpu-moe = -3\n')
    one_line_error(
        run_xover("study", str(spec), "-o", str(tmp_path / "out")), "n-cpu-moe must be a non-negative integer"
    )
    assert not (tmp_path / "out").exists()  # failed before anything expensive started


def test_offload_beyond_layers_and_context_beyond_training_fail_early(tmp_path: Path) -> None:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    model = write_model(PRESETS["tiny-moe"], tmp_path / "tiny.gguf").path  # 4 layers, 32K training context
    r = run_xover("bench", "-m", str(model), "--ncmoe", "2,9", "--depth", "0", "-o", str(tmp_path / "b"))
    one_line_error(r, "--n-cpu-moe 9 is beyond")
    assert "use 0..4" in r.stderr
    spec = tmp_path / "long.toml"
    spec.write_text(f'[model]\npath = "{model}"\n[study]\nlengths = [65536]\n[[config]]\nname = "a"\n')
    one_line_error(run_xover("study", str(spec), "-o", str(tmp_path / "s"), "-q"), "exceed")
    assert not (tmp_path / "s" / "results.sqlite").exists()  # nothing measured


def test_an_interrupt_asyncio_wraps_while_shutting_down_is_still_an_interrupt(monkeypatch, capsys) -> None:
    """A signal that lands while asyncio.run tidies up (its default executor's shutdown) surfaces as asyncio's
    RuntimeError with the KeyboardInterrupt as its context: the CLI still says its one line and exits 130; any
    other RuntimeError is not taken for an interrupt."""
    import asyncio

    import xover.cli as cli_module
    from xover.llamacpp.process import interrupted_by

    def wrapped() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("Event loop stopped before Future completed.")  # noqa: B904 (as asyncio raises it)

    def fails(**_: object) -> None:
        wrapped()

    monkeypatch.setattr(cli_module.cli, "main", fails)
    with pytest.raises(SystemExit) as e:
        cli_module.main([])
    assert e.value.code == 130 and "xover: interrupted; completed results are kept" in capsys.readouterr().err

    def broken(**_: object) -> None:
        asyncio.run(asyncio.sleep(0))
        raise RuntimeError("a real bug")

    monkeypatch.setattr(cli_module.cli, "main", broken)
    with pytest.raises(RuntimeError, match="a real bug"):
        cli_module.main([])
    assert not interrupted_by(RuntimeError("a real bug"))
