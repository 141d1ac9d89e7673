"""The tests of tests/unit/test_theory.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

from click.testing import CliRunner

from xover.analysis import theory as T


def test_cli_theory_and_predict(tmp_path) -> None:
    from xover.cli import cli
    from xover.results.store import Store

    runner = CliRunner()
    r = runner.invoke(cli, ["theory", "-m", "preset:tiny-moe", "--hw", "cpu", "--ncmoe", "0,2", "--lengths", "1k,2k"])
    assert r.exit_code == 0, r.output
    assert "Expert coverage" in r.output and "Predicted TTFT" in r.output
    r = runner.invoke(
        cli,
        [
            "predict",
            "--preset",
            "qwen3-30b-a3b",
            "--hw",
            "h200",
            "--ncmoe",
            "12,18",
            "--lengths",
            "1k",
            "--no-op-offload",
            "0",
            "-o",
            str(tmp_path),
            "--json",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    with Store(tmp_path) as st:
        ((_, name, body),) = st.artifacts("prediction")
    assert name == "prediction" and body["measurements_before"] == 0
    assert T.predicted_value(body, "ncmoe=18", 1024, "decode_tps") > 0
    r = runner.invoke(cli, ["theory", "-m", "preset:nope", "--hw", "cpu"])
    assert r.exit_code != 0 and "unknown model preset" in str(r.exception)


# --------------------------------------------------------------------------------------------------
# other architectures (issue 19)
