"""The knob sweeps and `xover advise` against the real CPU llama-bench and llama-server on tiny-moe.

On a CPU-only build the GPU knobs (-lm none, -nopo, GGML_OP_OFFLOAD_MIN_BATCH) change nothing that
matters, yet they must be passed through, recorded, measured and named when their effect stays
within noise. Two shared cores make every effect noisy: these tests assert structure and the noise
rule, never which knob wins. Sizes are small (prompts of 512-1024 tokens, -r 2).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from xover.analysis import advise
from xover.cli import main
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig, matrix
from xover.llamacpp.binaries import Binaries
from xover.measure import bench as benchrun
from xover.report.advise import advise_section_html, advise_section_markdown
from xover.results.store import Store

pytestmark = pytest.mark.real

MIN_BATCH = ("GGML_OP_OFFLOAD_MIN_BATCH", "1024")


def _run(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None)


def _account(search: advise.Search) -> Counter[str]:
    """How many processes the search started for each reason it has to start one, derived from its decisions
    (verdicts, kept values) rather than from its trials; then checked against its trials both ways: a trial no
    reason accounts for, or a reason with no trial, fails.

    The reasons: the defaults; the defaults again (the drift between processes); one trial per candidate value; a
    second process for a value whose lead (on the turn or on its decode part) was within
    :data:`advise.CLEAR_MARGIN` of the noise; the kept values together (two or more kept); the decode winners
    together (two or more, where that is not the kept values' setting)."""
    trials = {t.setting: t for t in search.trials}
    candidates = {
        (v.knob, value): next(
            t.setting for t in search.trials
            if t.varied == v.knob and not advise.is_again(t.setting) and dict(t.setting)[v.knob] == value
        )
        for v in search.verdicts
        for value in [e.value for e in v.effects] + list(v.failed)
    }  # fmt: skip
    expected: dict[advise.Setting, str] = {(): "defaults", advise.RECHECK: "defaults again (drift)"}
    expected |= {setting: "candidate" for setting in candidates.values()}
    # an effect measured on two processes had its second one; a second process that failed leaves a one-process
    # effect, so a second process is accounted for by its candidate, never unexplained
    twice = {advise.again(candidates[v.knob, e.value]) for v in search.verdicts for e in v.effects if e.processes == 2}
    retried = {s for s in trials if advise.is_again(s) and s != advise.RECHECK}
    assert twice <= retried
    assert all(advise.first_of(s) in candidates.values() for s in retried)
    assert all(trials[s].estimate is None for s in retried - twice)
    expected |= {s: "second process of a marginal value" for s in retried}
    kept = {v.knob: v.kept for v in search.verdicts if v.kept is not None}
    assert dict(search.combination).items() >= kept.items()
    if len(kept) >= 2:
        expected.setdefault(search.combination, "kept values together")
    else:  # the defaults, or the one kept value's own trial
        assert search.combination in expected
    decode_kept = {}
    for v in search.verdicts:
        best = min(v.effects, key=lambda e: e.decode_change_s, default=None)
        if best is not None and best.decode_change_s < 0 and not best.decode_within_noise:
            decode_kept[v.knob] = best.value
    together = [s for s in trials if s not in expected]
    if len(decode_kept) >= 2:
        assert len(together) <= 1  # none where the decode winners are the kept values
        for s in together:
            assert trials[s].varied is None and dict(s).items() >= decode_kept.items()
            expected[s] = "decode winners together"
    assert set(trials) == set(expected), (
        f"unaccounted {set(trials) - set(expected)}, missing {set(expected) - set(trials)}"
    )
    return Counter(expected.values())


def test_bench_sweeps_load_mode_and_batch_and_records_peak_memory(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    tests = benchrun.BenchTests(model=tiny_model, depths=(0, 512), n_prompt=256, n_gen=16, repetitions=2)
    configs = matrix(
        [
            (opts.LOAD_MODE, ("none", "mmap")),
            (opts.BATCH_SIZE, ("1024",)),
            (opts.UBATCH_SIZE, ("256",)),
            (opts.NO_OP_OFFLOAD, ("1",)),
            (opts.THREADS, ("2",)),
        ],
        env=[("GGML_OP_OFFLOAD_MIN_BATCH", ("1024",))],
    )
    outcome = benchrun.run_sweep(tests, configs, llama_bins, tmp_path, command=["test"])
    assert outcome.failures == () and outcome.stored == 8
    assert [c.label for c in outcome.configs] == ["lm=none", "lm=mmap"]
    with Store(tmp_path) as store:
        results = store.bench_results()
        peaks = benchrun.memory_by_config(store)
        stored_configs = {c.key: c for c in store.configs()}
    for config in outcome.configs:
        lm = config.get("load-mode")
        records = [r.record for _, _, _, r in results if r.config_key == config.key]
        assert len(records) == 4
        # what llama-bench says it ran: every swept knob, the GPU ones included
        assert {(r["load_mode"], r["n_batch"], r["n_ubatch"], r["no_op_offload"], r["n_threads"]) for r in records} == {
            (lm, 1024, 256, 1, 2)
        }
        # the environment knob, recorded with the configuration (a setting of the table, passed as environment)
        assert stored_configs[config.key].get(MIN_BATCH[0]) == MIN_BATCH[1]
        assert stored_configs[config.key].environment() == (MIN_BATCH,)
        use = peaks[config.key]
        assert use.peak_rss_bytes is not None and use.peak_rss_bytes > 4 << 20
        kinds = {(dev, kind) for dev, kind, _ in use.buffers}
        assert {("CPU", "KV"), ("CPU", "compute")} <= kinds
        assert (("CPU_Mapped", "model") in kinds) == (lm == "mmap")  # mmap maps the file; none reads it into a buffer
        assert use.device_bytes is None  # a CPU build allocates nothing on an accelerator


def test_ttft_takes_the_same_knobs_and_records_server_memory(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(
        [
            "ttft",
            "-m",
            str(tiny_model),
            "--load-mode",
            "none",
            "--ubatch",
            "128,256",
            "--no-op-offload",
            "1",
            "--env",
            "GGML_OP_OFFLOAD_MIN_BATCH=1024",
            "--lengths",
            "128,256",
            "-r",
            "1",
            "--response-tokens",
            "8",
            "--threads",
            "2",
            "-o",
            str(tmp_path),
            "--llama-bin-dir",
            str(llama_bins.bin_dir),
        ]
    )
    out = capsys.readouterr().out
    assert "ub=128" in out and "ub=256" in out
    with Store(tmp_path) as store:
        configs = store.configs()
        samples = [s for _, _, _, s in store.ttft_samples()]
        peaks = benchrun.memory_by_config(store, source="llama-server")
    assert [c.label for c in configs] == ["ub=128", "ub=256"]
    for config, ub in zip(configs, ("128", "256")):
        assert isinstance(config, LlamaConfig)
        args = list(config.server_argv())
        assert args[args.index("-lm") + 1] == "none" and args[args.index("-ub") + 1] == ub and "--no-op-offload" in args
        assert config.environment() == (MIN_BATCH,)
        # and the server was started with them
        started = (tmp_path / "logs" / f"server-{config.label}-1.log").read_text().splitlines()[0]
        assert " ".join(config.server_argv()) in started
        use = peaks[config.key]
        assert use.peak_rss_bytes is not None and ("CPU", "KV") in {(d, k) for d, k, _ in use.buffers}
    assert len(samples) == 4 and all(s.cache_ok for s in samples)
    logs = sorted((tmp_path / "logs").iterdir())
    assert all("-lv 4" in log.read_text().splitlines()[0] for log in logs)


def test_advise_searches_ranks_names_knobs_without_effect_and_stores_its_advice(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(
        [
            "advise",
            "-m",
            str(tiny_model),
            "--ncmoe",
            "0",
            "--lengths",
            "512,1024",
            "--response-tokens",
            "16",
            "--knobs",
            "lm,ub,nopo,GGML_OP_OFFLOAD_MIN_BATCH",
            "--ubatch",
            "256",
            "-r",
            "2",
            "--pp",
            "512",
            "--tg",
            "16",
            "--confirm-reps",
            "1",
            "--budget",
            "1h",  # the plan keeps every value and depth whatever the machine's speed: the search is the subject
            "-o",
            str(tmp_path),
            "--llama-bin-dir",
            str(llama_bins.bin_dir),
        ]
    )
    out = capsys.readouterr().out
    with Store(tmp_path) as store:
        (body,) = [b for _, _, b in store.artifacts(advise.ARTIFACT)]
        bench_configs = {c.label: c for c in store.configs()}
    advice = advise.advice_from_dict(body)
    (search,) = advice.searches
    assert advice.backend == "CPU" and advice.workload.lengths == (512, 1024)

    # every process the search started has a named reason, and every reason the search's own decisions imply has its
    # process: how many there are is the noise's to decide (which value leads by a little), the accounting is not
    reasons = _account(search)
    assert reasons["defaults"] == 1 and reasons["defaults again (drift)"] == 1
    assert reasons["candidate"] == 4  # one per candidate value: lm=none, ub=256, nopo=1, the environment knob
    assert search.measurements == sum(reasons.values())
    assert search.drift_s is not None
    assert [t.setting for t in search.trials][:5] == [
        (),
        (("load-mode", "none"),),
        (("ubatch-size", "256"),),
        (("no-op-offload", "1"),),
        (MIN_BATCH,),
    ]
    # the GPU knobs were passed through and are what llama-bench reports having run
    effective = {t.setting: dict(t.measurement.effective) for t in search.trials}
    assert effective[(("load-mode", "none"),)]["load_mode"] == "none"
    assert effective[(("no-op-offload", "1"),)]["no_op_offload"] == "1"
    assert bench_configs["ncmoe=0 GGML_OP_OFFLOAD_MIN_BATCH=1024"].environment() == (MIN_BATCH,)

    # the noise rule, from each configuration's spread between repetitions
    base = search.defaults.estimate
    assert base is not None and len(base.turn_samples_s) == 2
    for v in search.verdicts:
        for e in v.effects:
            runs = [t for t in search.trials if t.varied == v.knob and dict(t.setting)[v.knob] == e.value]
            trial = runs[0]
            assert trial.estimate is not None and len(runs) == e.processes
            one_rule = max(trial.estimate.spread_s + base.spread_s, search.drift_s or 0.0)  # both spreads added
            if e.processes == 1:
                assert e.noise_s == one_rule
                assert e.within_noise == advise.within_noise(trial.estimate, base, search.drift_s)
            else:  # a marginal winner measured again: the means of two processes each, against each side's
                # difference between its two processes, added
                t1, t2 = (t.estimate.turn_s for t in runs)  # type: ignore[union-attr]
                d1, d2 = base.turn_s, search.trial(advise.RECHECK).estimate.turn_s  # type: ignore[union-attr]
                assert e.change_s == pytest.approx((t1 + t2) / 2 - (d1 + d2) / 2)
                assert e.noise_s == pytest.approx(max(one_rule, abs(t2 - t1) + abs(d2 - d1)))
        assert v.no_effect == all(e.within_noise for e in v.effects)
        if v.kept is not None:
            assert v.best is not None and v.best.change_s < -v.best.noise_s
    # it still ranks: the recommendation is the fastest of the defaults and the settings made of kept values (a
    # value that won once and not on its second process is no candidate), unless within noise of the defaults
    kept_values = {v.knob: v.kept for v in search.verdicts if v.kept is not None}
    candidates = [
        t
        for t in search.trials
        if t.estimate
        and not advise.is_again(t.setting)
        and (t.setting in ((), search.combination) or (t.varied in kept_values and dict(t.setting)[t.varied] == kept_values[t.varied]))
    ]  # fmt: skip
    fastest = min(candidates, key=lambda t: t.estimate.turn_s)  # type: ignore[union-attr]
    assert search.recommended in ((), fastest.setting)
    # the theory expects nothing of the GPU knobs on a CPU-only build
    for setting in ((("load-mode", "none"),), (("no-op-offload", "1"),), (MIN_BATCH,)):
        expected = advice.expectation(search, setting)
        assert expected is not None and expected.change == pytest.approx(1.0) and "CPU-only build" in expected.note
    # memory measured for every configuration
    assert all(t.measurement.peak_rss_bytes for t in search.trials)

    md = advise_section_markdown(advice)
    assert md in out  # the command prints what it stores
    assert "llama-server -m " in md and "Recommendation: " in md
    no_effect = advice.no_effect(search)
    assert ("no effect on this hardware (within measurement noise): " + ", ".join(no_effect) in md) == bool(no_effect)
    if search.recommended != ():
        # the server check is a new measurement: it may or may not agree, and the report must say which
        c = advice.confirmation
        assert c is not None
        assert ("NOT confirmed through llama-server" in md) == (c.gain < 1)
        assert ("Confirmed through llama-server" in md) == (c.gain >= 1)
        assert [p.length for p in advice.confirmation.defaults] == [512, 1024]
    assert advise_section_html(advice).count("<table>") >= 1

    # the same command again reuses every measurement from the store
    _run(
        [
            "advise",
            "-m",
            str(tiny_model),
            "--ncmoe",
            "0",
            "--lengths",
            "512,1024",
            "--response-tokens",
            "16",
            "--knobs",
            "lm,ub,nopo,GGML_OP_OFFLOAD_MIN_BATCH",
            "--ubatch",
            "256",
            "-r",
            "2",
            "--pp",
            "512",
            "--tg",
            "16",
            "--no-confirm",
            "--budget",
            "1h",
            "-o",
            str(tmp_path),
            "--llama-bin-dir",
            str(llama_bins.bin_dir),
        ]
    )
    with Store(tmp_path) as store:
        again = advise.advice_from_dict(store.artifacts(advise.ARTIFACT)[-1][2])
    assert again.reused == again.measurements == search.measurements
    assert again.searches[0].recommended == search.recommended


def test_a_budget_that_cannot_hold_the_defaults_ends_after_the_first_process_in_one_line(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    """Issue 68: the plan is priced from the defaults' first llama-bench process (the probe); a budget that even the
    defaults alone and their confirmation would overrun ends there, with one line naming the --budget to give, and
    nothing else is measured."""
    from procs import run_xover

    r = run_xover(
        "advise", "-m", str(tiny_model), "--ncmoe", "0", "--lengths", "512,1024", "--budget", "1",
        "-o", str(tmp_path), "--llama-bin-dir", str(llama_bins.bin_dir),
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("xover: error:")]
    assert "--budget 1 s" in line and "cannot hold even llama.cpp's defaults" in line
    assert re.search(r"give --budget \d+m or more", line), line
    with Store(tmp_path) as store:
        labels = {c.label for c in store.configs()}
        assert not store.artifacts(advise.ARTIFACT)
    assert labels == {"ncmoe=0 defaults"}  # the probe alone


def test_the_plan_is_printed_with_what_it_left_out_and_the_wait(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    """Issue 68: before the search the plan says its values, depths, processes and minutes; each measurement says
    its number of the planned ones and the minutes left. (Which values a tight budget leaves out is the machine's
    speed to decide: tests/unit/test_advise_plan.py has the known answers.)"""
    from procs import run_xover

    r = run_xover(
        "advise", "-m", str(tiny_model), "--ncmoe", "0", "--lengths", "512,1024", "--knobs", "ub,b,t",
        "--ubatch", "256,1024", "-r", "2", "--pp", "512", "--tg", "16", "--no-confirm", "--budget", "1h",
        "-o", str(tmp_path), "--llama-bin-dir", str(llama_bins.bin_dir),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = " ".join((r.stderr + r.stdout).split())  # the progress goes to stderr, the advice to stdout
    # the depths and values the plan keeps are the machine's speed to decide (a busy machine drops some): its shape
    plan = re.search(r"plan: (.*?); depths 0(, [\d,]+)+; about (\d+) llama-bench processes of ~\d+ s(?: and|:)", out)
    assert plan is not None, out
    planned = int(plan.group(3))
    assert re.search(rf"\b1/~{planned} ncmoe=0 defaults \.\.\. \(about [\d.]+ min left\)", out), out


def _slow_bins(llama_bins: Binaries, tmp_path: Path) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from fakes.slow_bench import write_bin_dir

    return write_bin_dir(tmp_path / "slowbin", llama_bins.bin_dir)


def test_on_slow_rates_the_plan_shrinks_in_its_stated_order_and_refuses_what_it_cannot_hold(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    """Issue 68 on a llama-bench whose records report slow rates (tests/fakes/slow_bench.py: the real llama-bench,
    its rates replaced by 40 prefill and 4 decode tokens/s): the plan, priced from the probe, prints before the first
    measurement of the search what it did to fit, in the stated order: (1) fewer depths, the default band halved to its
    floor (and the ubatch that runs the same work as a smaller one out); (2) the ubatches screened in one llama-bench
    process; (3) the values ranked lowest out. Stopped there (Ctrl-C), nothing is left running. A budget that cannot
    hold even the defaults' processes ends after the probe with one line naming the --budget to give."""
    import signal
    import subprocess
    import sys

    slow = _slow_bins(llama_bins, tmp_path)
    argv = [sys.executable, "-m", "xover", "advise", "-m", str(tiny_model), "--ncmoe", "0", "--knobs", "ub,b",
            "--no-confirm", "--llama-bin-dir", str(slow)]  # fmt: skip
    proc = subprocess.Popen([*argv, "--budget", "1h", "-o", str(tmp_path / "a")], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:  # the plan comes before the search's first measurement
        lines.append(line)
        if re.search(r"\b1/~\d+ ", line):
            break
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    text = " ".join("".join(lines).split())
    plan = re.search(
        r"plan: (.*?); depths 0, ([\d,]+); about (\d+) llama-bench processes .*?; to fit it: (.*?) 1/~", text
    )
    assert plan is not None, text
    steps = plan.group(4).split("; ")
    # 1. fewer depths: the band halved to its floor (512 tokens)
    assert steps[0].startswith("depths 0, 6,912, 14,080, 20,992, 28,160 measured at 0, 1,792 (fewer depths, the band")
    assert "agentic: uniform over 512, 768, 1,280, 1,792 tokens" in steps[0]
    assert steps[1].endswith("-ub 4096 would run the same ubatches")
    # 2. screening, before any value leaves
    assert steps[2] == "ub=1024/2048 screened, each knob's values in one llama-bench process"
    # 3. the values ranked lowest: here every one (an hour holds the defaults' three processes alone)
    assert steps[3] == "values ub=2048, ub=1024, b=4096 (ranked lowest)"
    assert plan.group(1) == "none" and plan.group(3) == "3"
    # a budget that cannot hold even that: one line, after the probe alone
    r = subprocess.run([*argv, "--budget", "10m", "-o", str(tmp_path / "b")], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 2, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("xover: error:")]
    assert "--budget 10.0 min" in line and "cannot hold even llama.cpp's defaults at depths 0, 1,792" in line
    assert re.search(r"give --budget \d+m or more", line), line
    with Store(tmp_path / "b") as store:
        assert {c.label for c in store.configs()} == {"ncmoe=0 defaults"}  # the probe alone
