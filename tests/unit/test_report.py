"""The report is rebuilt from a store alone; text from outside is escaped."""

import pytest

from fakes.records import provenance
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, ServerTimings, TtftSample
from xover.report.html import build_report, render_html, render_markdown, write_report
from xover.results.read_model import crossover_inputs, load
from xover.results.store import Store

LENGTHS = (1000, 4000, 16000, 32000)


def _fill(study, model_name="m.gguf"):
    """Two configs with known rates: A prefills 2000 t/s and decodes 100 t/s, B 4000 t/s and 50 t/s.
    With R = 200, their totals cross at exactly 8000 tokens."""
    with Store(study) as st:
        run = st.begin_run("ttft", ["xover", "ttft"], provenance(model_name))
        for label, threads, prefill, decode in (("A", "1", 2000.0, 100.0), ("B", "2", 4000.0, 50.0)):
            cfg = LlamaConfig(name=label, settings=(("threads", threads),))
            st.put_config(cfg)
            for L in LENGTHS:
                for rep in range(3):
                    ttft_ns = int((0.1 + L / prefill) * 1e9)
                    t = ServerTimings(0, L, ttft_ns / 1e6 - 1.0, prefill, 200, 200 / decode * 1000, decode)
                    st.add_ttft_sample(
                        run,
                        "mk",
                        TtftSample(
                            cfg.key,
                            "cold",
                            L,
                            rep,
                            f"{label}{L}{rep}",
                            0,
                            ttft_ns - 10,
                            ttft_ns,
                            ttft_ns + 2 * 10**9,
                            (ttft_ns,),
                            200,
                            t,
                            True,
                        ),
                    )
                st.add_bench_result(
                    run, "mk", BenchResult(cfg.key, 512, 0, L, (1, 2), (prefill, prefill), prefill, 1.5, {})
                )
            # one polluted sample: stored, never averaged
            st.add_ttft_sample(
                run,
                "mk",
                TtftSample(
                    cfg.key,
                    "cold",
                    1000,
                    9,
                    "bad",
                    0,
                    1,
                    2,
                    3,
                    (2,),
                    1,
                    ServerTimings(999, 1, 0.1, 1.0, 1, 1.0, 1.0),
                    False,
                ),
            )
        st.end_run(run, "done")


def test_report_finds_the_known_crossover(tmp_path):
    _fill(tmp_path)
    data = load(tmp_path)
    configs = crossover_inputs(data)
    assert [c.label for c in configs] == ["A", "B"]
    assert all(len(v) == 3 for v in configs[0].ttft_s.values())  # the polluted sample is excluded
    rep = build_report(data, response=200, n_boot=50)
    (pair,) = rep.pairs
    assert abs(pair.interpolated[0].length - 8000) < 1
    assert "A is faster below ~8,000 tokens and B above" in rep.verdicts[0]
    html_text = render_html(rep)
    assert html_text.count("<img id='plot-") == 3
    assert "1 / 4" in html_text or "3 / 4" in html_text  # cold-check row shows the failed sample
    md = render_markdown(rep)
    assert "| A | 4,000 | 2000.00 ± 1.50 |" in md
    html_path, md_path = write_report(rep, tmp_path)
    assert html_path.read_text() == html_text and (tmp_path / "plot-total.png").stat().st_size > 1000


def test_hostile_text_is_escaped(tmp_path):
    _fill(tmp_path, model_name="<script>alert(1)</script>.gguf")
    html_text = render_html(build_report(load(tmp_path), n_boot=0))
    assert "<script>" not in html_text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.gguf" in html_text


def test_busy_note_prefers_the_measured_busy_share_over_the_lagging_load_average():
    from types import SimpleNamespace

    from xover.measure.provenance import cpu_busy_share
    from xover.report.html import _load_note

    before = "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4 5\n"
    after = "cpu  250 0 150 900 0 0 0 0 0 0\n"
    assert cpu_busy_share(before, after) == pytest.approx(2 / 3)  # 200 of 300 jiffies not idle
    assert cpu_busy_share("", after) is None and cpu_busy_share(before, before) is None
    # a build that just ended: load average 10.5 on 16 CPUs, but the CPUs are idle now
    after_build = SimpleNamespace(extra=(("cpu_count", "16"), ("loadavg_1m", "10.50"), ("cpu_busy", "0.03")))
    assert _load_note(after_build) == "; load 10.50 on 16 CPUs at start, CPUs 3% busy"
    busy = SimpleNamespace(extra=(("cpu_count", "2"), ("loadavg_1m", "0.20"), ("cpu_busy", "0.90")))
    assert _load_note(busy).endswith("(BUSY: other work skews these timings)")
    old = SimpleNamespace(extra=(("cpu_count", "16"), ("loadavg_1m", "10.50")))  # stores from before cpu_busy
    assert _load_note(old).endswith("(BUSY: other work skews these timings)")


def test_backend_names_follow_llama_bench():
    from xover.measure.provenance import backend_name

    assert backend_name("cuda") == "CUDA" == backend_name("CUDA")
    assert backend_name("cpu, blas") == "CPU,BLAS" and backend_name("") == "" and backend_name("Foo") == "Foo"


def test_the_plot_marks_only_crossovers_the_verdict_claims(tmp_path):
    from xover.analysis.crossover import ConfigData, compare_pair
    from xover.report.plots import crossing_marks

    # equal speed within noise: the medians cross between 1K and 4K, the sample ranges overlap everywhere
    noisy_a = ConfigData("ncmoe=18", {1000: [2.0, 2.2, 2.4], 4000: [8.4, 8.0, 8.2]}, {1000: [50.0], 4000: [50.0]})
    noisy_b = ConfigData("ncmoe=18 -nopo", {1000: [2.1, 2.3, 2.5], 4000: [7.9, 8.3, 8.1]}, {1000: [50.0], 4000: [50.0]})
    noisy = compare_pair(noisy_a, noisy_b, 200, n_boot=0)
    assert any(c.kind == "cross" for c in noisy.interpolated) and set(noisy.separated) == {0}
    assert crossing_marks([noisy]) == []
    _fill(tmp_path)
    rep = build_report(load(tmp_path), response=200, n_boot=0)
    (mark,) = crossing_marks(rep.headline)
    assert abs(mark.length - 8000) < 1 and not mark.fitted and mark.text == "A = B\n@ 8,000"
