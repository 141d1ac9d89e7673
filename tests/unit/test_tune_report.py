"""The report of a study with a tuning stage: verdicts at llama.cpp's defaults and at each configuration's best,
the offload penalty tuning removes, the pair matrix, per-knob prefill and decode effects ("no effect" where every
value is within noise), and whether llama-bench's gain shows through llama-server. Constructed numbers only."""

import dataclasses

import pytest

from fakes.records import provenance
from xover.analysis import advise
from xover.analysis.advise import Knob, Measurement, RateSamples
from xover.analysis.tradeoff import ratio
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, ServerTimings, TtftSample
from xover.report.html import build_report, render_html, render_markdown
from xover.report.tune import ServedRow, knob_rows, layout, pooled_rates
from xover.results.read_model import load
from xover.results.store import Store

LENGTHS = (1024, 4096, 16384, 32768)
DEPTHS = (0, 1024)
KNOBS = (
    Knob("load-mode", "-lm", "auto", ("none",), "load_mode", gpu_only=True),
    Knob("ubatch-size", "-ub", "512", ("4096",), "n_ubatch"),
    Knob("threads", "-t", "auto", ("8",), "n_threads"),
)
# (prefill t/s, server decode t/s) per configuration; the tuned variants prefill faster.
RATES = {"gpu": (4000.0, 100.0), "gpu tuned": (5000.0, 100.0), "cpu": (500.0, 50.0), "cpu tuned": (1000.0, 48.0)}
# llama-bench pp @ dL per configuration: cpu tuned gains 2x at 1K (as served) but 4x at 4K (not served)
BENCH_PP = {
    ("gpu", 1024): 4000.0,
    ("gpu", 4096): 3800.0,
    ("gpu tuned", 1024): 5000.0,
    ("gpu tuned", 4096): 4750.0,
    ("cpu", 1024): 500.0,
    ("cpu", 4096): 480.0,
    ("cpu tuned", 1024): 1000.0,
    ("cpu tuned", 4096): 1920.0,
}
# One configuration per label, told apart by a setting (the same label gets the same key in every fill).
CONFIGS = {label: LlamaConfig(name=label, settings=(("threads", str(i + 1)),)) for i, label in enumerate(RATES)}


def _jitter(value: float, reps: int = 3, rel: float = 0.004) -> tuple[float, ...]:
    return tuple(value * (1 + rel * (i - (reps - 1) / 2)) for i in range(reps))


def fake_measure(pp0: float, tg0: float):
    """ub=4096 doubles prefill and costs 4% decode (a trade-off); lm=none speeds prefill 1.3x; threads do nothing."""

    def measure(setting):
        s = dict(setting)
        pp = pp0 * (2.0 if s.get("ubatch-size") == "4096" else 1.0) * (1.3 if s.get("load-mode") == "none" else 1.0)
        tg = tg0 * (0.96 if s.get("ubatch-size") == "4096" else 1.0)
        return Measurement(
            tuple(RateSamples(d, 4096, _jitter(pp / (1 + d / 20_000))) for d in DEPTHS),
            tuple(RateSamples(d, 64, _jitter(tg / (1 + d / 80_000))) for d in DEPTHS),
            effective=(("n_threads", "16"),),
        )

    return measure


def search(pp0: float = 500.0, tg0: float = 50.0) -> advise.Search:
    return advise.coordinate_search(KNOBS, fake_measure(pp0, tg0), advise.uniform_workload(LENGTHS, 200))


def tune_body(config: str, variant: str | None, s: advise.Search) -> dict:
    label = advise.setting_label(KNOBS, s.recommended)
    return {
        "schema": "xover.tune/1",
        "config": config,
        "variant": variant,
        "setting": [list(x) for x in s.recommended],
        "setting_label": label,
        "server_args": ["-ncmoe", "18"],
        "env": [],
        "server_command": f"llama-server -m m.gguf -ncmoe 18 {label} <b>",
        "response": 200,
        "depths": list(DEPTHS),
        "chunk": 4096,
        "workload": "uniform over 4 lengths, R=200",
        "knobs": [dataclasses.asdict(k) for k in KNOBS],
        "search": dataclasses.asdict(s),
    }


def fill(study, rates=RATES, tune=True, study_artifact=True, sent_at=0):
    with Store(study) as st:
        run = st.begin_run("study", ["xover", "study"], provenance(backend="CUDA", gpu="gpu"))
        for label, (prefill, decode) in rates.items():
            cfg = CONFIGS[label]
            st.put_config(cfg)
            for L in LENGTHS:
                for rep, ttft_s in enumerate(_jitter(0.1 + L / prefill)):
                    ns = int(ttft_s * 1e9)
                    dec = _jitter(decode)[rep]
                    t = ServerTimings(0, L, ns / 1e6 - 1.0, prefill, 200, 200 / dec * 1000, dec)
                    st.add_ttft_sample(
                        run,
                        "mk",
                        TtftSample(
                            cfg.key,
                            "cold",
                            L,
                            rep,
                            f"{label}{L}{rep}",
                            sent_at,
                            ns - 10,
                            ns,
                            ns + 2 * 10**9,
                            (ns,),
                            200,
                            t,
                            True,
                        ),
                    )
                if (label, L) in BENCH_PP:
                    pp = BENCH_PP[(label, L)]
                    st.add_bench_result(run, "mk", BenchResult(cfg.key, 512, 0, L, (1, 2, 3), _jitter(pp), pp, 1.0, {}))
        if tune:
            st.add_artifact(None, "tune", tune_body("gpu", "gpu tuned", search(4000.0, 100.0)))
            st.add_artifact(None, "tune", tune_body("cpu", "cpu tuned", search()))
        if study_artifact:
            st.add_artifact(
                None,
                "study",
                {"configs": ["gpu", "cpu"], "pairs": [], "response_tokens": [200], "band": [10000, 40000]},
            )
        st.end_run(run, "done")


def test_the_search_finds_the_planted_trade_off_knob():
    s = search()
    assert dict(s.recommended) == {"load-mode": "none", "ubatch-size": "4096", "batch-size": "4096"}
    rows = {(r.knob, r.value): r for r in knob_rows(s, 200)}
    ub = rows[("ubatch-size", "4096")]
    assert ub.status == "kept" and ub.effect is not None
    assert ub.effect.prefill.median == pytest.approx(2.0, rel=0.01) and ub.effect.prefill.beyond_noise
    assert ub.effect.decode.median == pytest.approx(0.96, rel=0.01) and ub.effect.decode.beyond_noise
    # constant rates pooled over depths 0 and 1K: L (1/p - 1/2p) = 200 (1/0.96d - 1/d)
    p, d = pooled_rates(s.defaults.measurement.prefill)[1], pooled_rates(s.defaults.measurement.decode)[1]
    assert ub.effect.break_even == pytest.approx(200 * (1 / (0.96 * d) - 1 / d) / (1 / p - 1 / (2 * p)), rel=0.01)
    threads = rows[("threads", "8")]
    assert threads.status == "no effect" and not threads.effect.prefill.beyond_noise
    assert rows[("recommended", "lm=none ub=4096 b=4096")].effect.prefill.median == pytest.approx(2.6, rel=0.01)


def test_pooled_rate_is_tokens_over_time_across_depths():
    tests = [RateSamples(0, 100, (100.0, 50.0)), RateSamples(1024, 100, (50.0, 50.0))]
    assert pooled_rates(tests) == pytest.approx([200 / 3.0, 50.0])


def test_layout_falls_back_to_first_seen_labels_and_the_first_two_bases(tmp_path):
    fill(tmp_path, study_artifact=False)
    data = load(tmp_path)
    lay = layout(data)
    assert lay.bases == ("gpu", "cpu") and lay.tuned == {"gpu": "gpu tuned", "cpu": "cpu tuned"} and lay.pairs == ()
    assert lay.best("cpu") == "cpu tuned" and lay.base_of["gpu tuned"] == "gpu"
    assert [r.config for r in data.tune_results()] == ["gpu", "cpu"]


def test_verdicts_answer_the_question_at_the_defaults_and_at_each_configuration_s_best(tmp_path):
    fill(tmp_path)
    rep = build_report(load(tmp_path), response=200, n_boot=0)
    v = rep.verdicts
    assert len(v) == 4, v
    assert v[0].startswith("Fastest total time per turn") and "gpu tuned" in v[0]
    assert v[1].startswith("At llama.cpp's defaults: gpu vs cpu: gpu is faster at every measured length")
    assert v[2].startswith("Each configuration at its best: gpu tuned vs cpu tuned: gpu tuned is faster")
    # 16K: cpu (0.1 + 16384/500 + 4) / gpu (0.1 + 16384/4000 + 2) at the defaults; tuned alike
    at_defaults = (0.1 + 16384 / 500 + 4) / (0.1 + 16384 / 4000 + 2)
    tuned = (0.1 + 16384 / 1000 + 200 / 48) / (0.1 + 16384 / 5000 + 2)
    assert v[3] == (
        f"Tuning and the offload penalty (200-token responses): a turn on cpu takes, against gpu, at 16K "
        f"{at_defaults:.2f}x at llama.cpp's defaults and {tuned:.2f}x when both are tuned; at 32K "
        f"{(0.1 + 32768 / 500 + 4) / (0.1 + 32768 / 4000 + 2):.2f}x at llama.cpp's defaults and "
        f"{(0.1 + 32768 / 1000 + 200 / 48) / (0.1 + 32768 / 5000 + 2):.2f}x when both are tuned."
    )
    # every other pair is in the matrix, not in a verdict
    assert rep.matrix is not None and rep.matrix.labels == ("gpu", "gpu tuned", "cpu", "cpu tuned")
    assert rep.matrix.cells[0][1] == "slower" and rep.matrix.cells[1][0] == "faster"
    assert rep.matrix.cells[2][3].startswith("slower")
    md = render_markdown(rep)
    verdict_md = md.split("### Every pair of configurations")[0]
    assert verdict_md.count("\n- ") == 4
    # tuned, cpu trades 4% of its decode for 2x prefill: the fitted costs cross at ~167 tokens, below the data
    assert "| cpu tuned | slower | slower | faster; fit crosses ~167 (extrapolated) | — |" in md


def test_a_configuration_whose_tuning_kept_the_defaults_is_its_own_best(tmp_path):
    rates = {k: v for k, v in RATES.items() if k != "gpu tuned"}
    fill(tmp_path, rates=rates, tune=False)
    with Store(tmp_path) as st:
        st.add_artifact(None, "tune", tune_body("gpu", None, search(4000.0, 100.0)))
        st.add_artifact(None, "tune", tune_body("cpu", "cpu tuned", search()))
    rep = build_report(load(tmp_path), response=200, n_boot=0)
    assert rep.verdicts[2].startswith("Each configuration at its best: gpu vs cpu tuned:")
    assert "with each at its best (gpu keeps llama.cpp's defaults)" in rep.verdicts[3]
    md = render_markdown(rep)
    assert "### gpu: llama.cpp's defaults kept" in md
    # a configuration on another engine kept that engine's defaults
    from xover.report.tune import Measured, blocks

    assert rep.layout is not None
    on_ik = Measured({c.label: c for c in rep.configs}, rep.data.bench, rep.data.cold_samples(), 200, rep.band,
                     engines={"gpu": "ik_llama.cpp"})  # fmt: skip
    heads = [b.text for b in blocks(rep.layout, on_ik) if b.kind == "h3"]
    assert "gpu: ik_llama.cpp's defaults kept" in heads and "gpu: llama.cpp's defaults kept" not in heads


def test_when_tuning_kept_every_default_both_verdicts_are_still_told(tmp_path):
    rates = {k: v for k, v in RATES.items() if not k.endswith("tuned")}
    fill(tmp_path, rates=rates, tune=False)
    with Store(tmp_path) as st:
        st.add_artifact(None, "tune", tune_body("gpu", None, search(4000.0, 100.0)))
        st.add_artifact(None, "tune", tune_body("cpu", None, search()))
    v = build_report(load(tmp_path), response=200, n_boot=0).verdicts
    assert v[0].startswith("At llama.cpp's defaults: gpu vs cpu: gpu is faster at every measured length"), v
    assert (
        v[1] == "Each configuration at its best: tuning kept llama.cpp's defaults for both, so the answer above stands."
    )
    assert len(v) == 2


def test_without_a_tuning_stage_the_verdict_has_no_prefix(tmp_path):
    fill(tmp_path, rates={k: v for k, v in RATES.items() if not k.endswith("tuned")}, tune=False)
    v = build_report(load(tmp_path), response=200, n_boot=0).verdicts
    assert len(v) == 1 and v[0].startswith("gpu vs cpu: gpu is faster"), v


def test_a_study_of_one_configuration_and_its_tuned_variant_answers_that_pair(tmp_path):
    """One placement under a budget (the gpt-oss-120b studies): no second configuration to pair with, so the
    verdict is what tuning buys on that one."""
    fill(tmp_path, rates={k: v for k, v in RATES.items() if k.startswith("cpu")}, tune=False, study_artifact=False)
    with Store(tmp_path) as st:
        st.add_artifact(None, "tune", tune_body("cpu", "cpu tuned", search()))
        st.add_artifact(
            None, "study", {"configs": ["cpu"], "pairs": [], "response_tokens": [200], "band": [10000, 40000]}
        )
    v = build_report(load(tmp_path), response=200, n_boot=0).verdicts
    assert len(v) == 1, v
    assert v[0].startswith(
        "Tuned against llama.cpp's defaults: cpu vs cpu tuned: cpu tuned is faster at every measured length"
    ), v


def test_a_pair_measured_hours_apart_is_told_so(tmp_path):
    """A study resumed in another session measured one side of the pair there: the verdict stands, with a
    caution naming when and in which runs, since the machine may have drifted in between (decode above all).
    Runs minutes apart (a study's servers one after another) need none."""
    hour = 3600 * 10**9
    fill(tmp_path, rates={"gpu": RATES["gpu"]}, tune=False, sent_at=1_764_000_000 * 10**9)
    fill(tmp_path, rates={"cpu": RATES["cpu"]}, tune=False, sent_at=1_764_000_000 * 10**9 + hour // 2)
    v = build_report(load(tmp_path), response=200, n_boot=0).verdicts
    assert len(v) == 1 and v[0].startswith("gpu vs cpu: gpu is faster"), v
    fill(tmp_path / "apart", rates={"gpu": RATES["gpu"]}, tune=False, sent_at=1_764_000_000 * 10**9)
    fill(tmp_path / "apart", rates={"cpu": RATES["cpu"]}, tune=False, sent_at=1_764_000_000 * 10**9 + 3 * hour)
    v = build_report(load(tmp_path / "apart"), response=200, n_boot=0).verdicts
    assert len(v) == 2 and v[0].startswith("gpu vs cpu: gpu is faster"), v
    assert v[1] == (
        "Measured 3.0 h apart: gpu's cold samples at 2025-11-24T16:00-16:00 UTC (run 1), cpu's at "
        "2025-11-24T19:00-19:00 UTC (run 2). Their difference includes any drift of the machine in between (its decode "
        "speed above all): compare them with care, or measure both again together."
    )


def test_the_tuning_section_shows_flags_command_effects_and_no_effect(tmp_path):
    fill(tmp_path)
    rep = build_report(load(tmp_path), response=200, n_boot=0)
    md = render_markdown(rep)
    assert "## Tuning: llama.cpp settings per configuration" in md
    assert "### cpu → cpu tuned: lm=none ub=4096 b=4096" in md
    assert "```sh\nllama-server -m m.gguf -ncmoe 18 lm=none ub=4096 b=4096 <b>\n```" in md
    threads = next(line for line in md.splitlines() if line.startswith("| threads | 8 |"))
    assert "| no effect |" in threads and "within noise" in threads
    ub = next(line for line in md.splitlines() if line.startswith("| ubatch-size | 4096 |"))
    assert "| kept |" in ub and "faster past ~" in ub
    assert "No effect on this hardware (every value within noise of the defaults): threads." in md
    html_text = render_html(rep)
    assert "&lt;b&gt;" in html_text and "<b>" not in html_text


def test_the_serving_path_flags_a_llama_bench_gain_llama_server_does_not_show(tmp_path):
    fill(tmp_path)
    rep = build_report(load(tmp_path), response=200, n_boot=0)
    md = render_markdown(rep)
    section = md.split("### cpu: defaults vs cpu tuned through llama-server")[1]
    rows = [line for line in section.splitlines() if line.startswith("| 1K |") or line.startswith("| 4K |")]
    assert "llama-bench gain not seen through llama-server" not in rows[0]  # 2x in both
    assert rows[1].endswith("llama-bench gain not seen through llama-server |")  # 4x in llama-bench, ~2x served
    assert "llama-bench gain not seen through llama-server at 4K" in section


def test_served_row_flags_only_a_bench_gain_beyond_noise():
    gain = ratio([100.0, 101.0], [200.0, 202.0])
    assert ServedRow(1024, gain, ratio([10.0, 12.0], [11.0, 12.5])).not_seen  # served within noise
    assert ServedRow(1024, gain, ratio([10.0, 10.1], [13.0, 13.1])).not_seen  # +30% < half of +100%
    assert not ServedRow(1024, gain, ratio([10.0, 10.1], [18.0, 18.1])).not_seen  # +80%
    assert not ServedRow(1024, ratio([100.0, 110.0], [105.0, 115.0]), ratio([10.0, 10.1], [10.0, 10.1])).not_seen


def test_a_resumed_search_left_to_a_configuration_the_study_no_longer_measures_says_nothing_of_its_rounds(tmp_path):
    """A search whose recommendation runs another configuration's command leaves it to that configuration's rounds
    (``same_as``). Resumed by a run of a changed spec without that configuration, the stored record still named it:
    the report would have called its rounds the variant's confirmation. The study record says what was measured."""
    fill(tmp_path, tune=False, study_artifact=False)
    with Store(tmp_path) as st:
        st.add_artifact(None, "tune", {**tune_body("gpu", "gpu tuned", search(4000.0, 100.0)), "same_as": "removed"})
        st.add_artifact(None, "tune", {**tune_body("cpu", "cpu tuned", search()), "same_as": "gpu"})
        st.add_artifact(None, "tune", {**tune_body("old", "old tuned", search()), "same_as": "as-gpu"})
        st.add_artifact(
            None,
            "study",
            {
                "configs": ["gpu", "cpu"],
                "pairs": [],
                "response_tokens": [200],
                "band": [10000, 40000],
                "same_as": [["as-gpu", "gpu"]],  # measured once, under gpu's name
            },
        )
    by_config = {r.config: r.same_as for r in layout(load(tmp_path)).records}
    assert by_config == {"gpu": None, "cpu": "gpu", "old": "as-gpu"}
