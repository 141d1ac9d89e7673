"""The tuning stage's pure parts: which knobs a study searches, a configuration with a setting on top, the
spec keys, and the search on a fake machine with known rates finding the known best settings (including a
prefill-for-decode trade that pays over the study's lengths and one that does not)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from fakes.known import defaults_and_t1
from xover.analysis import advise
from xover.analysis.advise import DEFAULTS, Measurement, RateSamples, Setting
from xover.domain.artifacts import TuneRecord
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec, spec_from_dict
from xover.errors import XoverError
from xover.measure import tune
from xover.report.blocks import blocks_markdown
from xover.report.tune import _record_blocks, _rounds_of
from xover.results.read_model import _read_search, load
from xover.results.store import Store

BASE = LlamaConfig("ncmoe=18", settings=(("n-cpu-moe", "18"), ("n-gpu-layers", "99"), ("ubatch-size", "512")))


def _spec(**kw: object) -> StudySpec:
    return StudySpec(configs=(BASE, LlamaConfig("ncmoe=0", (("n-cpu-moe", "0"),))), model_preset="tiny-moe", **kw)  # type: ignore[arg-type]


def test_setting_on_top_of_a_configuration_replaces_its_flags_in_place() -> None:
    knobs = tune.knobs_for(_spec(), gpu_build=True)
    setting = advise.normalize(
        knobs, {"ubatch-size": "4096", "load-mode": "none", "no-op-offload": "1", "GGML_OP_OFFLOAD_MIN_BATCH": "1024"}
    )
    c = advise.apply_setting(BASE, knobs, setting, "ncmoe=18 tuned")
    assert c.name == "ncmoe=18 tuned"
    # the base's ubatch is replaced (not passed twice); -lm and -b (raised with the ubatch) join the base's
    # settings, all kept in the option table's order
    assert c.settings == (
        ("n-cpu-moe", "18"),
        ("n-gpu-layers", "99"),
        ("load-mode", "none"),
        ("ubatch-size", "4096"),
        ("batch-size", "4096"),
        ("no-op-offload", "1"),
        ("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),
    )
    assert c.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),) and c.env == ()
    assert c.server_argv() == (
        "-ncmoe",
        "18",
        "-ngl",
        "99",
        "-lm",
        "none",
        "-ub",
        "4096",
        "-b",
        "4096",
        "--no-op-offload",
    )
    # the defaults change nothing but the name
    assert advise.apply_setting(BASE, knobs, DEFAULTS, "x") == dataclasses.replace(BASE, name="x")


def test_study_knobs_per_build() -> None:
    gpu_spec, cpu_spec = _spec(lengths=(1024, 32768)), _spec(lengths=(1024, 8192))
    gpu = {k.name: k for k in tune.knobs_for(gpu_spec, gpu_build=True)}
    cpu = {k.name: k for k in tune.knobs_for(cpu_spec, gpu_build=False)}
    every = {
        "load-mode",
        "ubatch-size",
        "batch-size",
        "no-op-offload",
        "GGML_OP_OFFLOAD_MIN_BATCH",
        "no-host",
        "repack",
        "threads",
        "flash-attn",
        "cache-type-k",
        "cache-type-v",
    }
    assert set(gpu) == set(cpu) == every  # what can act here is decided per configuration, with a reason
    assert gpu["load-mode"].candidates == ("none", "mlock")
    assert gpu["ubatch-size"].candidates[-1] == "8192"  # a 32K prompt holds two 8K ubatches
    assert "8192" not in cpu["ubatch-size"].candidates  # no 8K ubatch for 8K prompts on a CPU-only build
    avx2, q4k = frozenset({"avx2"}), (("Q4_K", 256),)
    # with a GPU: everything but --no-repack (nothing is repacked unless --no-host)
    knobs, skipped = tune.applicable(gpu_spec, tuple(gpu.values()), advise.Context(True, avx2, q4k))
    kv = {"cache-type-k", "cache-type-v"}
    assert {k.name for k in knobs} == every - {"repack", "batch-size"} - kv  # -b alone: the same ubatches
    assert [n for n, _ in skipped] == ["repack", "cache-type-k", "cache-type-v", "batch-size"]
    assert dict(skipped)["cache-type-k"].startswith("searched only under a VRAM budget")
    # under a VRAM budget (a fit configuration) the KV cache types are searched: they move the level
    knobs, skipped = tune.applicable(gpu_spec, tuple(gpu.values()), advise.Context(True, avx2, q4k, budget=True))
    assert {k.name for k in knobs} == every - {"repack", "batch-size"}
    assert [n for n, _ in skipped] == ["repack", "batch-size"]
    assert gpu["cache-type-k"].candidates == gpu["cache-type-v"].candidates == ("q8_0",)
    # nothing is copied to a GPU on a CPU-only build: those knobs are left out, each with its reason
    knobs, skipped = tune.applicable(cpu_spec, tuple(cpu.values()), advise.Context(False, avx2, q4k))
    assert {k.name for k in knobs} == {"ubatch-size", "repack", "threads", "flash-attn"}
    assert {n: why for n, why in skipped if n not in kv | {"batch-size"}} == {
        n: "a CPU-only build copies no weights to a GPU"
        for n in ("load-mode", "no-op-offload", "GGML_OP_OFFLOAD_MIN_BATCH", "no-host")
    }
    assert tune.chunk(knobs) == 4096


def test_spec_keys_narrow_the_search() -> None:
    spec = _spec(tune_knobs=("lm", "ub"), tune_values=(("ub", ("2048",)),), tune_depths=())
    knobs = tune.knobs_for(spec, gpu_build=True)
    assert [(k.name, k.candidates) for k in knobs] == [("load-mode", ("none", "mlock")), ("ubatch-size", ("2048",))]
    assert tune.depths(spec) == (0,)
    assert tune.depths(_spec()) == (0, 1024)  # default: depth 0 and the shortest length
    # named on a CPU build: searched anyway (the search then shows it has no effect)
    named = _spec(tune_knobs=("load-mode",))
    knobs, skipped = tune.applicable(named, tune.knobs_for(named, gpu_build=False), advise.Context(False))
    assert [k.name for k in knobs] == ["load-mode"] and skipped == ()


def test_spec_from_toml_dict() -> None:
    doc = {
        "model": {"preset": "tiny-moe"},
        "study": {
            "tune": True,
            "tune-knobs": ["load-mode", "ub"],
            "tune-values": {"ub": [2048, 4096]},
            "tune-depths": ["1k"],
            "tune-repetitions": 3,
            "pairs": [["a", "b"]],
        },
        "config": [{"name": "a"}, {"name": "b", "n-cpu-moe": 4}],
    }
    spec = spec_from_dict(doc)
    assert spec.tune and spec.tune_knobs == ("load-mode", "ub") and spec.tune_values == (("ub", ("2048", "4096")),)
    assert spec.tune_depths == (1024,) and spec.tune_repetitions == 3 and spec.pairs == (("a", "b"),)
    assert not spec_from_dict({**doc, "study": {"tune": False}}).tune


@pytest.mark.parametrize(
    ("study", "message"),
    [
        ({"tune": "yes"}, "tune must be true or false"),
        ({"tune-knobs": ["warp-speed"]}, "unknown knob 'warp-speed'"),
        ({"tune-values": {"warp": [1]}}, "unknown knob 'warp'"),
        ({"tune-repetitions": 1}, "at least 2"),
        ({"pairs": [["a", "c"]]}, "'c' is not a configuration"),
        ({"pairs": ["a"]}, "pairs must be a list of [NAME, NAME]"),
        ({"tune-depths": "1k"}, "tune-depths must be a list"),
    ],
)
def test_bad_tune_keys_are_one_line_errors(study: dict[str, object], message: str) -> None:
    doc = {"model": {"preset": "tiny-moe"}, "study": study, "config": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(XoverError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        spec_from_dict(doc)
    assert "\n" not in str(e.value)


# ---- the search on a fake machine with known rates --------------------------------------------------


def _rates(pp: float, tg: float, reps: int = 3) -> Measurement:
    jitter = (0.998, 1.0, 1.002)[:reps]
    return Measurement(
        prefill=(RateSamples(0, 4096, tuple(pp * j for j in jitter)),),
        decode=(RateSamples(0, 128, tuple(tg * j for j in jitter)),),
        effective=(("n_threads", "16"), ("backends", "CUDA")),
    )


def machine(setting: Setting) -> Measurement:
    """Known rates: pinned weights triple prefill and cost 10% of decode; a 4096-token ubatch doubles prefill;
    op offload off halves it; threads and flash attention change nothing; mlock is mmap."""
    s = dict(setting)
    pp, tg = 500.0, 80.0
    if s.get("load-mode") == "none":
        pp, tg = pp * 3, tg * 0.9
    pp *= {"1024": 1.3, "2048": 1.7, "4096": 2.0, "8192": 1.9}.get(s.get("ubatch-size", ""), 1.0)
    if s.get("no-op-offload") == "1" or s.get("GGML_OP_OFFLOAD_MIN_BATCH") == "1024":
        pp *= 0.5
    return _rates(pp, tg)


def test_search_finds_the_known_best_settings_on_a_fake_machine() -> None:
    spec = _spec(lengths=(1024, 4096, 16384, 32768))
    knobs = tune.knobs_for(spec, gpu_build=True)
    search = advise.coordinate_search(knobs, machine, tune.workload(spec), None)
    assert dict(search.recommended) == {"load-mode": "none", "ubatch-size": "4096", "batch-size": "4096"}
    verdicts = {v.knob: v for v in search.verdicts}
    assert verdicts["threads"].no_effect and verdicts["flash-attn"].no_effect
    assert verdicts["load-mode"].kept == "none" and not verdicts["load-mode"].no_effect
    assert verdicts["no-op-offload"].kept is None and not verdicts["no-op-offload"].no_effect  # slower, not noise
    variant = advise.apply_setting(BASE, knobs, search.recommended, tune.variant_name(BASE.name))
    assert variant.server_argv() == ("-ncmoe", "18", "-ngl", "99", "-lm", "none", "-ub", "4096", "-b", "4096")


def test_a_trade_that_only_pays_for_long_prompts_is_not_taken_for_short_ones() -> None:
    """Pinned weights: 3x prefill, 0.9x decode. With 200-token responses it pays at every study length here;
    with 4000-token responses on 64-token prompts the decode loss dominates and the defaults' load mode stays."""
    knobs = tune.knobs_for(_spec(tune_knobs=("load-mode",)), gpu_build=True)
    long_prompts = advise.uniform_workload((4096, 32768), 200)
    short_prompts = advise.uniform_workload((64,), 4000)
    assert dict(advise.coordinate_search(knobs, machine, long_prompts).recommended) == {"load-mode": "none"}
    assert advise.coordinate_search(knobs, machine, short_prompts).recommended == DEFAULTS


def test_stored_result_round_trip_and_signature(tmp_path: Path) -> None:
    spec = _spec(lengths=(1024, 4096))
    knobs = tune.knobs_for(spec, gpu_build=True)
    search = advise.coordinate_search(knobs, machine, tune.workload(spec), None)
    # a confirmation in rounds that lands within noise keeps nothing: no variant, llama.cpp's defaults
    within = tune.Confirmation(search.recommended, {1: 10.0, 2: 10.5, 3: 9.8}, {1: 9.9, 2: 10.6, 3: 9.7})
    rejected = tune._body(
        BASE, knobs, search, spec, Path("/m/q.gguf"), "CUDA", tune.chunk(knobs), tune.Confirmed(DEFAULTS, within)
    )
    assert not within.kept and rejected["variant"] is None and rejected["setting"] == []
    assert rejected["confirmation"]["kept"] is False and rejected["confirmation"]["n"] == 3
    faster = tune.Confirmation(search.recommended, {1: 10.0, 2: 10.5, 3: 9.8}, {1: 5.0, 2: 5.2, 3: 4.9})
    body = tune._body(
        BASE,
        knobs,
        search,
        spec,
        Path("/m/q.gguf"),
        "CUDA",
        tune.chunk(knobs),
        tune.Confirmed(search.recommended, faster),
    )
    assert faster.kept and body["confirmation"]["kept"] is True
    assert body["variant"] == "ncmoe=18 tuned" and body["setting_label"] == "lm=none ub=4096 b=4096"
    assert body["server_command"] == "llama-server -m q.gguf -ncmoe 18 -ngl 99 -lm none -ub 4096 -b 4096"
    assert body["signature"] == BASE.key  # the tuned configuration's key
    with Store(tmp_path) as store:
        store.add_artifact(None, tune.ARTIFACT, body)
    data = load(tmp_path)
    found = tune.stored(data, spec.configs)
    assert set(found) == {"ncmoe=18"} and found["ncmoe=18"].reused
    assert (
        tune.variants(found.values())[0].server_argv()
        == advise.apply_setting(BASE, knobs, search.recommended, "x").server_argv()
    )
    # a configuration whose settings changed since is tuned again
    changed = dataclasses.replace(BASE, settings=(("n-cpu-moe", "20"),))
    assert tune.stored(data, (changed,)) == {}


def test_the_spec_knows_the_knobs_the_search_defines() -> None:
    from xover.domain.llama_options import ENGINES
    from xover.domain.study_spec import TUNE_KNOBS

    knobs = {(k.name, k.short) for e in ENGINES for k in advise.study_knobs(4, gpu_build=True, longest=32768, engine=e)}
    assert set(TUNE_KNOBS) == knobs


def test_the_search_measures_at_the_cached_turns_depth_by_default() -> None:
    """A study with cached turns on a 16K context scores them with rates at 16K, not at depth 0 (issue 46 item 3);
    tune-depths, when given, is what it says."""
    study = {"lengths": ["1k", "4k"], "cached-turns": ["512", "2k"], "cached-depth": "16k"}
    config = [{"name": "a"}]
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": study, "config": config})
    assert tune.depths(spec) == (0, 1024, 16384)
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": {**study, "tune-depths": []}, "config": config})
    assert tune.depths(spec) == (0,)
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": {"lengths": ["1k", "4k"]}, "config": config})
    assert tune.depths(spec) == (0, 1024)


def test_a_larger_batch_alone_is_not_searched_where_it_runs_the_same_ubatches() -> None:
    """llama.cpp runs ubatches of min(-ub, -b): with -ub 512 (or any ubatch up to the default -b 2048), -b 4096 runs
    the same ubatches as the default, so it is skipped with that reason; a -b below the ubatch, or an ubatch above
    the default -b (which -b 2048 caps), acts and is searched."""
    assert advise.batch_reason(("4096",), 512) is not None
    assert "min(-ub, -b)" in (advise.batch_reason(("4096", "8192"), 2048) or "")
    assert advise.batch_reason(("256", "4096"), 512) is None  # -b 256 caps the ubatch at 256
    assert advise.batch_reason(("4096",), 4096) is None  # the default -b 2048 capped -ub 4096: -b 4096 lifts it
    knobs = advise.study_knobs(2, False, 2048)
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": {"lengths": ["1k"]}, "config": [{"name": "a"}]})
    kept, skipped = tune.applicable(spec, knobs, advise.Context(gpu_build=False))
    assert "batch-size" not in {k.name for k in kept} and "batch-size" in dict(skipped)
    assert "ubatch-size" in {k.name for k in kept}
    named = spec_from_dict(
        {
            "model": {"preset": "tiny-moe"},
            "study": {"lengths": ["1k"], "tune-knobs": ["batch-size"]},
            "config": [{"name": "a"}],
        }
    )
    kept, _ = tune.applicable(named, tune.knobs_for(named, False), advise.Context(gpu_build=False))
    assert [k.name for k in kept] == ["batch-size"]  # named in tune-knobs: searched whatever the theory says


def test_a_configuration_whose_own_batch_is_below_its_ubatch_searches_the_batch_and_raises_it_with_the_ubatch() -> None:
    """A configuration that runs ``-b 256`` runs 256-token ubatches whatever its ``-ub``: a larger ``-b`` alone
    acts there (it was skipped, as if the configuration ran llama.cpp's default ``-b``), and a larger ``-ub`` acts
    only with ``-b`` raised to it (its command kept ``-b 256``, a no-op trial)."""
    assert advise.batch_reason(("4096",), 512, 256) is None and advise.batch_reason(("4096",), 512, 2048) is not None
    knobs = advise.study_knobs(2, False, 2048)
    spec = spec_from_dict(
        {"model": {"preset": "tiny-moe"}, "study": {"lengths": ["1k"]}, "config": [{"name": "b256", "batch-size": 256}]}
    )
    (config,) = spec.configs
    kept, skipped = tune.applicable(spec, knobs, advise.Context(gpu_build=False), 512, 256)
    assert "batch-size" in {k.name for k in kept} and "batch-size" not in dict(skipped)
    ub = advise.apply_setting(config, knobs, (("ubatch-size", "1024"),), "b256 ub")
    assert ub.get("ubatch-size") == "1024" and ub.get("batch-size") == "1024"
    small = advise.apply_setting(config, knobs, (("ubatch-size", "128"),), "b256 small ub")
    assert small.get("batch-size") == "256"  # an ubatch within the configuration's own -b leaves it


def test_ubatches_no_prompt_fills_are_not_searched_and_the_test_is_no_longer_than_a_prompt() -> None:
    """Issue 46 item 8: with prompts of at most 2K tokens, -ub 4096 runs each of them as the one 2048-token ubatch
    that -ub 2048 runs, so only 1024 and 2048 are tried, and the prefill test is 2048 tokens, not 4096 (on 2 cores a
    4096-token test took 3x a 2048-token one); where the default already holds every prompt the knob goes."""
    assert advise.ubatch_reason(("1024", "2048", "4096"), 2048, 512)[0] == ("1024", "2048")
    assert advise.ubatch_reason(("1024", "2048", "4096"), 3000, 512) == (("1024", "2048", "4096"), None)
    assert advise.ubatch_reason(("1024", "2048"), 512, 512)[0] == ()
    assert "at most 512 tokens, one ubatch at the configuration's own 512-token ubatch" in (
        advise.ubatch_reason(("1024",), 512, 512)[1] or ""
    )
    # a configuration of -ub 1024 -b 768 runs 768-token ubatches: that, not llama.cpp's default, is named
    kept_768, why_768 = advise.ubatch_reason(("1024", "2048"), 512, 768)
    assert kept_768 == () and "own 768-token ubatch" in (why_768 or "") and "default" not in (why_768 or "")
    knobs = advise.study_knobs(2, False, 2048)
    spec = spec_from_dict(
        {"model": {"preset": "tiny-moe"}, "study": {"lengths": ["512", "2k"]}, "config": [{"name": "a"}]}
    )
    kept, skipped = tune.applicable(spec, knobs, advise.Context(gpu_build=False))
    assert advise.knob_named(kept, "ubatch-size").candidates == ("1024", "2048")  # type: ignore[union-attr]
    assert "-ub 4096 would run the same ubatches" in dict(skipped)["ubatch-size 4096"]
    assert tune.chunk(kept, spec.longest_prompt) == 2048 and tune.chunk(knobs, spec.longest_prompt) == 2048
    assert tune.chunk(knobs) == 4096
    short = spec_from_dict(
        {"model": {"preset": "tiny-moe"}, "study": {"lengths": ["256", "512"]}, "config": [{"name": "a"}]}
    )
    kept, skipped = tune.applicable(short, knobs, advise.Context(gpu_build=False))
    assert "ubatch-size" not in {k.name for k in kept} and tune.chunk(kept, short.longest_prompt) == 512
    # cached turns' new tokens count as prompts; their cached context does not
    turns = {"lengths": ["512"], "cached-turns": ["2k"], "cached-depth": "16k"}
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": turns, "config": [{"name": "a"}]})
    assert spec.longest_prompt == 2048


def test_a_trial_that_runs_another_configurations_command_shares_its_process() -> None:
    """Issue 46 item 8: ``-t 1`` moved to ``-t 2`` on a machine whose llama.cpp runs 2 threads by default is the
    defaults' configuration: its trial is that process, not a new one; a second process of the same command (the
    recheck marker) is a different trial, and a failed one is never shared."""
    knobs = advise.default_knobs(cpu_count=2)
    shared = tune.SharedTrials()
    base = Measurement(effective=(("n_threads", "2"), ("n_ubatch", "512")))
    defaults, t1 = LlamaConfig("defaults"), LlamaConfig("t=1", (("threads", "1"),))
    shared.learn(defaults, knobs, base)
    shared.learn(t1, knobs, Measurement(effective=(("n_threads", "1"),)))
    assert shared.in_effect(t1) == {"threads": "2", "ubatch-size": "512"}  # t=1 sets -t: it teaches nothing of it
    assert shared.in_effect(dataclasses.replace(t1, backend="vulkan")) == {}  # another build: learned apart
    t2 = t1.with_values({"threads": "2"})
    assert tune.same_run(t2, shared.in_effect(t1)) == tune.same_run(defaults, shared.in_effect(t1))
    assert tune.same_run(t1, shared.in_effect(t1)) != tune.same_run(defaults, shared.in_effect(t1))
    ub = defaults.with_values({"ubatch-size": "2048", "threads": "2"})
    assert tune.same_run(ub, shared.in_effect(t1)) == tune.same_run(
        t1.with_values({"threads": "2", "ubatch-size": "2048"}), shared.in_effect(t1)
    )
    sweep = dataclasses.make_dataclass("Sweep", ["depths", "n_prompt", "n_gen", "repetitions", "round"], frozen=True)
    tests = sweep((0,), 512, 32, 3, None)
    ran: list[tuple[str, Setting]] = []
    ok = Measurement((RateSamples(0, 512, (1000.0,)),), (RateSamples(0, 32, (50.0,)),))

    def inner(name: str, fail: bool = False) -> Callable[..., Measurement]:
        def run(setting: Setting, fresh: bool = False) -> Measurement:
            ran.append((name, setting))
            return Measurement(failure="oom") if fail else ok

        return run

    notes: list[str] = []

    def emit(status: str, detail: str, *_: object) -> None:
        notes.append(detail)

    a = shared.measure(defaults, knobs, tests, inner("defaults"), emit)
    b = shared.measure(t1, knobs, tests, inner("t=1"), emit)
    assert a(DEFAULTS) is ok and b((("threads", "2"),)) is ok and ran == [("defaults", DEFAULTS)]
    assert "the same llama-bench command as defaults defaults" in notes[0]
    b(advise.again((("threads", "2"),)))  # a second process is its own trial
    b((("threads", "2"),), True)  # and so is one asked for fresh
    assert len(ran) == 3
    other = dataclasses.replace(tests, n_prompt=2048)  # other tests: not the same evidence
    shared.measure(t1, knobs, other, inner("t=1"), emit)((("threads", "2"),))
    assert len(ran) == 4
    failing = shared.measure(LlamaConfig("x", (("flash-attn", "on"),)), knobs, tests, inner("x", fail=True), emit)
    failing(DEFAULTS)
    failing(DEFAULTS)
    assert len(ran) == 6


def test_a_recommendation_that_is_another_configuration_is_left_to_the_studys_rounds() -> None:
    """Issue 46 item 8: ``t=1`` tuned to ``-t 2`` is the ``defaults`` configuration, which the cold stage measures
    beside it in rounds of fresh servers: those rounds confirm it. Without the cold stage, or for a setting no
    configuration runs, llama-bench rounds confirm it as before."""
    knobs = advise.default_knobs(cpu_count=2)
    shared = tune.SharedTrials()
    shared.learn(LlamaConfig("defaults"), knobs, Measurement(effective=(("n_threads", "2"),)))
    spec = defaults_and_t1()
    t1 = spec.configs[1]
    assert shared.configuration_of(t1, knobs, (("threads", "2"),), spec) == "defaults"
    assert shared.configuration_of(t1, knobs, (("threads", "2"), ("ubatch-size", "1024")), spec) is None
    assert shared.configuration_of(t1, knobs, DEFAULTS, spec) is None
    no_rounds = dataclasses.replace(spec, skip=spec.skip | {"ttft"})
    assert shared.configuration_of(t1, knobs, (("threads", "2"),), no_rounds) is None
    # no llama-bench rounds for it, and the variant is kept for the study's rounds to judge
    search = advise.Search(None, (), (), (("threads", "2"),), (("threads", "2"),))
    asked: list[object] = []

    def never(*a: object) -> Measurement:
        asked.append(a)
        raise AssertionError("no llama-bench rounds")

    work = tune.workload(spec)
    confirmed = tune._confirmations(
        search, never, never, work, None, spec, lambda *a: None, t1, lambda s, say=True: "defaults"
    )
    assert confirmed == tune.Confirmed((("threads", "2"),), same_as="defaults") and not asked
    body = tune._body(t1, knobs, search, spec, Path("m.gguf"), "CPU", 512, confirmed)
    assert body["variant"] == "t=1 tuned" and body["setting"] == [["threads", "2"]]
    text = blocks_markdown(_record_blocks(TuneRecord.from_body({**body, "same_as": "defaults"}), 200))
    assert "It runs the command of defaults, another configuration of this study" in text, text


def test_what_a_search_adds_on_top_of_a_moved_own_knob_is_confirmed_against_that_knob() -> None:
    """Seen on 2 cores: ``t=1``'s search moved its own ``-t 1`` to ``-t 2`` (1.6x faster), then kept ``-nr`` on top
    of it by noise; confirmed against the defaults (``-t 1``), ``-nr -t 2`` won on the strength of ``-t 2`` alone.
    What the recommendation adds is now confirmed against its origin: not confirmed there, the variant runs the
    origin, and the origin, another configuration's command here, is left to the study's rounds; where it is no
    other configuration's, the origin is confirmed against the defaults in its turn."""
    spec = defaults_and_t1()
    t1, work = spec.configs[1], tune.workload(spec)
    origin, rider = (("threads", "2"),), (("repack", "0"), ("threads", "2"))
    search = advise.Search(None, (), (), rider, rider, origin=origin, first=("threads",))
    speed = {DEFAULTS: 1.0, origin: 1.6, rider: 1.6}  # -nr does nothing; -t 2 is 1.6x
    pairs: list[tuple[object, object]] = []

    def in_round(setting: advise.Setting, n: int, fresh: bool = False) -> Measurement:
        pairs.append((setting, n))
        wobble = (1.01 if n % 2 else 0.99) if setting == rider else 1.0  # the rider a little ahead, then behind
        rate = speed[setting] * wobble
        return Measurement(
            (advise.RateSamples(0, 512, (3000.0 * rate, 3010.0 * rate)),),
            (advise.RateSamples(0, 64, (60.0 * rate, 60.2 * rate)),),
        )

    def never(*a: object) -> Measurement:
        raise AssertionError("no decode rounds")

    left = tune._confirmations(
        search,
        in_round,
        never,
        work,
        None,
        spec,
        lambda *a: None,
        t1,
        lambda s, say=True: "defaults" if s == origin else None,
    )
    assert left.turn is not None and left.turn.against == origin and not left.turn.kept
    assert {s for s, _ in pairs} == {origin, rider}  # never against -t 1: the origin's gain is not the rider's
    assert left.setting == origin and left.same_as == "defaults" and left.origin is None
    body = tune._body(t1, advise.default_knobs(2), search, spec, Path("m.gguf"), "CPU", 512, left)
    assert body["setting"] == [["threads", "2"]] and body["variant"] == "t=1 tuned"
    text = blocks_markdown(_record_blocks(TuneRecord.from_body({**body, "same_as": left.same_as}), 200))
    assert "interleaved with threads=2" in text and "what it adds to threads=2 was not kept" in text, text
    assert "It runs the command of defaults" in text, text
    # the origin no other configuration runs: confirmed against the defaults in its turn
    pairs.clear()
    own = tune._confirmations(search, in_round, never, work, None, spec, lambda *a: None, t1, lambda s, say=True: None)
    assert own.origin is not None and own.origin.against == DEFAULTS and own.origin.kept
    assert own.setting == origin and {s for s, _ in pairs} == {origin, rider, DEFAULTS}
    body = tune._body(t1, advise.default_knobs(2), search, spec, Path("m.gguf"), "CPU", 512, own)
    text = blocks_markdown(_record_blocks(TuneRecord.from_body(body), 200))
    assert "threads=2: Confirmed in rounds of fresh llama-bench processes, interleaved with the defaults" in text, text
    assert "repack=0, threads=2: Not confirmed" in text and "1.00x threads=2's time per turn" in text, text
    # ahead by 1 % and behind by 1 % in turn, with up to 8 rounds under the budget: after 5 rounds no 3 more could
    # have put the interval below 1 (after 2, 6 more still could), so they are not measured
    assert "Stopped after 5 of at most 8 rounds: whatever the rounds left measured" in text, text
    assert sum(1 for s, n in pairs if s == rider) == 5


def test_a_confirmed_addition_to_an_origin_no_configuration_runs_is_confirmed_against_the_defaults_too() -> None:
    """An own knob moves on the search's two processes each (``Effect.separated``). Where what the search adds on top
    is then confirmed against that origin, the origin's own gain would be kept on those processes alone, unless
    another configuration's rounds measure it: the whole recommendation is confirmed against the defaults too."""
    spec = defaults_and_t1()
    t1, work = spec.configs[1], tune.workload(spec)
    origin, whole = (("threads", "2"),), (("threads", "2"), ("ubatch-size", "1024"))
    search = advise.Search(None, (), (), whole, whole, origin=origin, first=("threads",))
    pairs: list[object] = []

    def machine(speed: dict[advise.Setting, float]) -> Callable[..., Measurement]:
        def in_round(setting: advise.Setting, n: int, fresh: bool = False) -> Measurement:
            pairs.append(setting)
            wobble = 1.0 + 0.002 * (n % 3)  # the same for both sides of a round
            rate = speed[setting] * wobble
            return Measurement(
                (advise.RateSamples(0, 512, (3000.0 * rate, 3010.0 * rate)),),
                (advise.RateSamples(0, 64, (60.0 * rate, 60.2 * rate)),),
            )

        return in_round

    def never(*a: object) -> Measurement:
        raise AssertionError("no decode rounds")

    def run(speed: dict[advise.Setting, float], same_as: Callable[..., str | None]) -> tune.Confirmed:
        pairs.clear()
        return tune._confirmations(search, machine(speed), never, work, None, spec, lambda *a: None, t1, same_as)

    # -t 2 truly 1.6x, -ub 1024 1.2x more: both confirmations keep it
    real = run({DEFAULTS: 1.0, origin: 1.6, whole: 1.92}, lambda s, say=True: None)
    assert real.setting == whole and real.turn is not None and real.turn.kept and real.turn.against == origin
    assert real.origin is not None and real.origin.setting == whole and real.origin.against == DEFAULTS
    assert real.origin.kept and set(pairs) == {DEFAULTS, origin, whole}
    # -t 2 moved on two lucky processes and is in truth 0.7x: -ub 1024 is confirmed on top, the whole is not
    lucky = run({DEFAULTS: 1.0, origin: 0.7, whole: 0.84}, lambda s, say=True: None)
    assert lucky.turn is not None and lucky.turn.kept and lucky.origin is not None and not lucky.origin.kept
    assert lucky.setting == DEFAULTS
    body = tune._body(t1, advise.default_knobs(2), search, spec, Path("m.gguf"), "CPU", 512, lucky)
    text = blocks_markdown(_record_blocks(TuneRecord.from_body(body), 200))
    assert body["variant"] is None and "threads=2, ubatch-size=1024: Not confirmed" in text, text
    # -t 2 is the defaults configuration's command: the study's rounds measure it beside t=1, no llama-bench rounds
    said: list[bool] = []

    def defaults_runs(s: advise.Setting, say: bool = True) -> str | None:
        said.append(say)
        return "defaults" if s == origin else None

    left = run({DEFAULTS: 1.0, origin: 0.7, whole: 0.84}, defaults_runs)
    assert left.setting == whole and left.origin is None and DEFAULTS not in pairs
    assert said == [True, False]  # the origin asked quietly: it is not the recommendation
    # and the report says whose rounds the origin's gain rests on, where the study still runs that configuration
    assert left.origin_same_as == "defaults" and real.origin_same_as is None and lucky.origin_same_as is None
    body = tune._body(t1, advise.default_knobs(2), search, spec, Path("m.gguf"), "CPU", 512, left)
    record = TuneRecord.from_body({**body, "origin_same_as": left.origin_same_as}, _read_search)
    text = blocks_markdown(_record_blocks(record, 200))
    assert "threads=2 runs the command of defaults, another configuration of this study" in text, text
    assert "confirmed only what t=1 tuned adds to it" in text, text
    assert _rounds_of(record, {"defaults", "t=1"}).origin_same_as == "defaults"
    assert _rounds_of(record, {"t=1"}).origin_same_as is None  # a later spec without it: no such rounds
    real_body = tune._body(t1, advise.default_knobs(2), search, spec, Path("m.gguf"), "CPU", 512, real)
    assert "runs the command of" not in blocks_markdown(
        _record_blocks(TuneRecord.from_body(real_body, _read_search), 200)
    )


def test_rounds_of_the_same_two_commands_are_run_once_for_the_configurations_that_ask_them() -> None:
    """Seen on 2 cores: ``defaults`` confirmed ``-nr`` against the defaults in 6 processes, then ``t=1`` confirmed
    ``-nr -t 2`` against ``-t 2``, the same two commands where llama.cpp runs 2 threads, in 6 more."""
    spec = defaults_and_t1()
    defaults, t1 = spec.configs
    knobs = advise.study_knobs(cpu_count=2, gpu_build=False, longest=2048)
    shared = tune.SharedTrials()
    shared.learn(defaults, knobs, Measurement(effective=(("n_threads", "2"),)))
    sweep = SimpleNamespace(depths=(0,), n_prompt=512, n_gen=16, repetitions=2)  # the search's tests
    said: list[str] = []
    ran: list[str] = []

    def rounds_of(name: str) -> Callable[[], tune.Confirmation]:
        def run() -> tune.Confirmation:
            ran.append(name)
            return tune.Confirmation((("repack", "0"),), {1: 1.0, 2: 1.1, 3: 0.9}, {1: 1.0, 2: 1.0, 3: 1.0})

        return run

    def emit(status: str, detail: str, *_: object) -> None:
        said.append(detail)

    nr, t2 = (("repack", "0"),), (("threads", "2"),)
    first = shared.confirm_once(defaults, knobs, sweep, emit, None, nr, DEFAULTS, "turn", rounds_of("defaults"))
    again = shared.confirm_once(t1, knobs, sweep, emit, None, (*nr, *t2), t2, "turn", rounds_of("t=1"))
    assert ran == ["defaults"] and again.against_s == first.against_s and again.tuned_s == first.tuned_s
    assert again.setting == (*nr, *t2) and again.against == t2  # its own names in its record
    assert any("the same two llama-bench commands as defaults repack=0's rounds" in line for line in said), said
    # another pair, or another kind of turn, is rounds of its own
    shared.confirm_once(t1, knobs, sweep, emit, None, (("ubatch-size", "1024"), *t2), t2, "turn", rounds_of("ub"))
    shared.confirm_once(t1, knobs, sweep, emit, None, (*nr, *t2), t2, "cached", rounds_of("cached"))
    shared.confirm_once(t1, knobs, sweep, emit, 4, (*nr, *t2), t2, "turn", rounds_of("4 rounds"))  # more allowed
    assert ran == ["defaults", "ub", "cached", "4 rounds"]
    # rounds that failed are no one's answer
    ub = (("ubatch-size", "2048"),)

    def failing() -> tune.Confirmation:
        ran.append("failed")
        return tune.Confirmation(ub, {}, {}, "round 1: out of memory")

    shared.confirm_once(defaults, knobs, sweep, emit, None, ub, DEFAULTS, "turn", failing)
    shared.confirm_once(t1, knobs, sweep, emit, None, (*ub, *t2), t2, "turn", rounds_of("after a failure"))
    assert ran[-2:] == ["failed", "after a failure"]
    # decode alone runs llama-bench -p 0: the search's prompt length, which differs between configurations, is not
    # part of those rounds, so they are shared; rounds of whole turns at another prompt length are not
    longer = SimpleNamespace(depths=(0,), n_prompt=2048, n_gen=16, repetitions=2)
    shared.confirm_once(defaults, knobs, sweep, emit, None, nr, DEFAULTS, "decode", rounds_of("decode"))
    shared.confirm_once(t1, knobs, longer, emit, None, (*nr, *t2), t2, "decode", rounds_of("decode, longer prompt"))
    shared.confirm_once(t1, knobs, longer, emit, None, (*nr, *t2), t2, "turn", rounds_of("turn, longer prompt"))
    assert ran[-2:] == ["decode", "turn, longer prompt"]
    # what -fa auto ran as is one configuration's context, not the build's: not learned for the others
    shared.learn(defaults, advise.study_knobs(2, False, 2048), Measurement(effective=(("flash_attn", "0"),)))
    assert "flash-attn" not in shared.in_effect(t1)


def test_the_search_says_its_plan_and_cost_before_it_starts() -> None:
    """Known answer: 3 knobs of 2, 1 and 1 candidates are 5 processes (each candidate and the defaults again), then
    2x3-2x4 to confirm a recommendation in rounds; at 6 s a process, 0.5 min and 0.6-0.8 min more."""
    spec = _spec(tune_depths=())
    spec = dataclasses.replace(spec, rounds=3, max_rounds=4, budget_s=600.0)
    knobs = (advise.Knob("ubatch-size", "-ub", "512", ("1024", "2048")), advise.Knob("threads", "-t", "2", ("1",)),
             advise.Knob("flash-attn", "-fa", "auto", ("off",)))  # fmt: skip
    text = tune.search_plan(knobs, spec, 2048, 6.0)
    assert "at most 5 llama-bench processes" in text and "then 6-8 to confirm each recommendation" in text, text
    own = tune.search_plan(knobs, spec, 2048, 6.0, own=("threads",))
    assert "(t first: the others on top of its winner): at most 6 llama-bench processes" in own, own
    assert "the search 0.5 min, each confirmation 0.6-0.8 min more" in text, text
    assert "min" not in tune.search_plan(knobs, spec, 2048, 6.0, reused=True)  # a stored defaults' run: not timed


def test_a_confirmation_goes_past_the_studys_rounds_only_within_the_searchs_share_of_a_budget() -> None:
    """Issue 46 item 8: an undecided recommendation took 8 rounds (16 llama-bench processes, twice, for the turn and
    the decode variant) on the second shape, for a difference no larger than the noise. Without a budget the
    confirmation takes the study's rounds; under one, more rounds while they fit half the budget for this
    configuration; and the plan says so."""
    spec = dataclasses.replace(_spec(tune_depths=()), rounds=3, max_rounds=8)
    assert tune.confirm_rounds(spec, per_process_s=3.0, spent_s=20.0, configs=2) == 3
    budget = dataclasses.replace(spec, budget_s=150.0)  # 37.5 s for each of 2 configurations
    # 37.5 - 20 spent - 3 rounds of 6 s: nothing past the study's rounds; with 5 s spent, 12.5 s: 2 rounds more
    assert tune.confirm_rounds(budget, per_process_s=3.0, spent_s=20.0, configs=2) == 3
    assert tune.confirm_rounds(budget, per_process_s=3.0, spent_s=5.0, configs=2) == 3 + 2
    assert tune.confirm_rounds(budget, per_process_s=3.0, spent_s=5.0, configs=2, confirmations=2) == 3  # shared
    assert tune.confirm_rounds(budget, per_process_s=0.01, spent_s=0.0, configs=1, reused=True) == 3
    assert tune.confirm_rounds(budget, per_process_s=3.0, spent_s=60.0, configs=2) == 3  # spent: the study's rounds
    assert tune.confirm_rounds(budget, per_process_s=0.1, spent_s=0.0, configs=1) == 8  # never past max-rounds
    knobs = (advise.Knob("threads", "-t", "2", ("1",)),)
    assert "then 6 to confirm" in tune.search_plan(knobs, spec, 512, 3.0)
    assert "then 6-16 to confirm" in tune.search_plan(knobs, budget, 512, 3.0)


def test_deep_depths_are_planned_from_what_the_defaults_measured() -> None:
    """Issue 46 item 3: the cached turns' depth is searched at where its cost fits the search's share of the budget,
    and left out (with what it would cost) where it does not; tune-depths, when given, is what it says."""
    from xover.analysis import advise

    # 10 processes of 30 s at the cheap depths; 16K at 500 t/s costs each process 2 x 32.8 s: 656 s more
    plan = advise.plan_depths((0, 1024), (16384,), prefill_tps=500.0, per_process_s=30.0, processes=10, allowance_s=600)
    assert plan.depths == (0, 1024) and plan.left_out == ((16384, pytest.approx(655.36)),)
    assert "d16,384 (about 10.9 min more)" in plan.describe()
    roomy = advise.plan_depths(
        (0, 1024), (16384,), prefill_tps=500.0, per_process_s=30.0, processes=10, allowance_s=1e4
    )
    assert roomy.depths == (0, 1024, 16384) and roomy.left_out == () and roomy.describe() == ""
    # a study without a budget searches every depth it wants
    assert advise.plan_depths(
        (0,), (8192,), prefill_tps=1.0, per_process_s=1e3, processes=99, allowance_s=None
    ).depths == (0, 8192)
    # the study's spec decides what is planned: its cached depth by default, nothing where tune-depths is given
    study = {"lengths": ["1k"], "cached-turns": ["512"], "cached-depth": "16k", "budget": "20min"}
    config = [{"name": "a", "n-cpu-moe": 0}]
    spec = spec_from_dict({"model": {"preset": "tiny-moe"}, "study": study, "config": config})
    assert tune.cheap_depths(spec) == (0, 1024) and tune.planned(spec) == (16384,)
    given = spec_from_dict(
        {"model": {"preset": "tiny-moe"}, "study": {**study, "tune-depths": ["16k"]}, "config": config}
    )
    assert tune.planned(given) == () and tune.depths(given) == (0, 16384)
    base = advise.Measurement(
        prefill=(advise.RateSamples(0, 512, (900.0,)), advise.RateSamples(1024, 512, (500.0,))),
        decode=(advise.RateSamples(0, 32, (50.0,)),),
    )
    knobs = tune.knobs_for(spec, False, "llama.cpp")
    # 20 min a study, half for the search, one configuration: 600 s; the deep depth's cost is at 500 t/s (d1024's)
    at = tune.plan_depths(spec, knobs, base, per_process_s=1.0, configs=1)
    processes = tune.search_processes(knobs) + 2 * spec.rounds
    fits = 1.0 * processes + advise.depth_cost_s(16384, 500.0, processes) <= 600
    assert at.depths == ((0, 1024, 16384) if fits else (0, 1024))
    slow = tune.plan_depths(spec, knobs, base, per_process_s=200.0, configs=1)
    assert slow.depths == (0, 1024) and [d for d, _ in slow.left_out] == [16384]


def test_a_failed_or_short_confirmation_names_its_setting_where_a_record_may_hold_two() -> None:
    """A confirmation against the origin and one of the whole against the defaults can sit in one record: a failure or
    too few rounds says which setting it was."""
    from xover.report.tune import _rounds_text

    against_origin = {"setting": [["threads", "2"], ["ubatch-size", "1024"]], "against": [["threads", "2"]]}
    failed = _rounds_text({**against_origin, "failure": "round 1: out of memory"}, decode=False)
    assert failed.startswith("threads=2, ubatch-size=1024: The confirmation in rounds failed (round 1"), failed
    whole = {"setting": [["threads", "2"], ["ubatch-size", "1024"]], "against": [], "rounds": []}
    short = _rounds_text(whole, decode=False, named=True)
    assert short == "threads=2, ubatch-size=1024: Too few rounds to confirm it: the defaults were kept.", short
    # against the defaults and not named (a record's only confirmation): as before
    assert _rounds_text({**whole, "failure": "x"}, decode=False).startswith("The confirmation in rounds failed")


def test_the_rounds_planned_for_a_moved_origin_count_only_the_confirmations_that_can_run() -> None:
    """A recommendation that extends a moved own knob needs two confirmations (what it adds against the origin, then
    the whole or the origin against the defaults), unless the origin is another configuration's command, whose
    rounds of fresh servers judge its gain: then one, and the rounds' budget is not split over a check that never
    runs."""
    origin, whole = (("threads", "2"),), (("threads", "2"), ("ubatch-size", "1024"))
    extends = advise.Search(None, (), (), whole, whole, origin=origin, first=("threads",))
    assert tune._checks(extends, leaves=False) == 2
    assert tune._checks(extends, leaves=False, origin_leaves=True) == 1
    assert tune._checks(extends, leaves=True, origin_leaves=True) == 0
    plain = advise.Search(None, (), (), whole, whole)
    assert tune._checks(plain, leaves=False, origin_leaves=False) == 1
