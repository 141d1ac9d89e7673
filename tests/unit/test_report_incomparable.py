"""A study whose configurations share no measured prompt length still renders: the pair is named as one that
cannot be compared, in the verdicts and in the matrix, instead of the report failing."""

from __future__ import annotations

from pathlib import Path

from fakes.records import provenance
from xover.domain.config import LlamaConfig
from xover.domain.records import ServerTimings, TtftSample
from xover.report.html import NOT_COMPARABLE, build_report, render_html, render_markdown
from xover.results.read_model import load
from xover.results.store import Store


def _fill(study: Path, measured: dict[str, tuple[int, ...]]) -> None:
    """Cold samples of each configuration at its own lengths only (prefill 2000 t/s, decode 100 t/s)."""
    with Store(study) as st:
        run = st.begin_run("ttft", ["xover", "ttft"], provenance())
        for i, (label, lengths) in enumerate(measured.items()):
            cfg = LlamaConfig(name=label, settings=(("threads", str(i + 1)),))
            st.put_config(cfg)
            for L in lengths:
                for rep in range(3):
                    ns = int((0.1 + L / 2000) * 1e9) + rep * 1000
                    t = ServerTimings(0, L, ns / 1e6 - 1.0, 2000.0, 200, 2000.0, 100.0)
                    sample = TtftSample(
                        cfg.key, "cold", L, rep, f"{label}{L}{rep}", 0, ns - 10, ns, ns + 10**9, (ns,), 200, t, True
                    )
                    st.add_ttft_sample(run, "mk", sample)
        st.end_run(run, "done")


def test_a_pair_that_shares_no_length_is_named_not_compared(tmp_path: Path) -> None:
    _fill(tmp_path, {"short": (1000, 4000), "long": (16000, 32000)})
    rep = build_report(load(tmp_path), n_boot=0)
    assert rep.pairs == () and rep.headline == ()
    assert rep.incomparable == (("short", "long", "short and long share no measured prompt length"),)
    assert rep.verdicts == ("short vs long cannot be compared: short and long share no measured prompt length.",)
    md = render_markdown(rep)
    assert "- short vs long cannot be compared: short and long share no measured prompt length." in md
    assert "| short | 4,000 |" in md and "| long | 32,000 |" in md  # the measurements are still shown
    assert "short vs long cannot be compared" in render_html(rep)


def test_the_matrix_marks_the_pairs_that_cannot_be_compared(tmp_path: Path) -> None:
    _fill(tmp_path, {"a": (1000, 4000), "b": (1000, 4000), "c": (16000, 32000)})
    rep = build_report(load(tmp_path), n_boot=0)
    assert [(p.a, p.b) for p in rep.pairs] == [("a", "b")]
    assert {(a, b) for a, b, _ in rep.incomparable} == {("a", "c"), ("b", "c")}
    assert rep.matrix is not None and rep.matrix.labels == ("a", "b", "c")
    assert rep.matrix.cells[0][2] == rep.matrix.cells[2][0] == rep.matrix.cells[1][2] == NOT_COMPARABLE
    assert rep.matrix.cells[0][1] != NOT_COMPARABLE
    assert rep.verdicts[0].startswith("a vs b: ")  # the headline pair: the first two configurations
    assert NOT_COMPARABLE in render_markdown(rep)
