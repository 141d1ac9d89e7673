"""Defaults that fit the model, options spelled alike, warnings that rest on facts (issue 18, items 1, 2, 4).

* the default agentic session and advise's agentic band scale to the model's training context, with
  one line saying so; sizes the user gave are kept or refused with what fits;
* a command whose lengths exceed the context names the lengths that fit;
* ``-R``/``--response-tokens`` on every command that takes a response length;
* with ``--url`` the client-server gap warning rests on the slots ``/props`` reports and says that
  ``--cache-ram`` is not reported.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import pytest

from fakes.llama_server import FakeLlamaServer
from xover.analysis.stats import summarize
from xover.domain.workload import (
    CONTEXT_USE,
    MIN_TURN_CHARS,
    WorkloadSpec,
    estimate_tokens,
    fit_to_context,
    generate,
    last_turn_tokens,
    min_session_tokens,
)
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context, context_advice, fitting_lengths, model_context
from xover.measure.ttft import PointSummary, TtftPlan, TtftRun, gap_note
from xover.results.store import Store


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xover.domain.presets import PRESETS
    from xover.gguf.synth import write_model

    return write_model(PRESETS["tiny-moe"], tmp_path_factory.mktemp("m") / "tiny.gguf").path  # 4 layers, 32K context


# ---- item 1: the session ---------------------------------------------------------------------------


def test_default_session_scales_to_a_32k_context_with_one_line() -> None:
    spec, line = fit_to_context(WorkloadSpec(chars_per_token=1.0), 32768, 64, frozenset(), "tiny-moe")
    assert line == (
        "agentic session scaled to tiny-moe's training context of 32,768 tokens: 15 turns (default 30), "
        "a 7,296-token system prompt (default 10K), growing to 29,184 tokens (default 40K)"
    )
    assert spec.target_tokens + 64 <= 32768 and spec.system_tokens * 4 == spec.target_tokens
    assert min_session_tokens(spec) <= spec.target_tokens
    assert last_turn_tokens(spec) + 64 <= 32768 * CONTEXT_USE


def test_a_context_that_holds_the_default_changes_nothing() -> None:
    spec = WorkloadSpec()
    assert fit_to_context(spec, 262144, 64) == (spec, None)
    assert fit_to_context(spec, 0, 64) == (spec, None)  # no context in the header: nothing to fit


@pytest.mark.parametrize("n_ctx", [4096, 8192, 16384, 32768, 40960])
@pytest.mark.parametrize("cpt", [1.0, 4.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scaled_default_sessions_really_fit(n_ctx: int, cpt: float, seed: int) -> None:
    """The generated session's last turn (estimated as the replay's sizing would count it) fits."""
    spec, _ = fit_to_context(WorkloadSpec(seed=seed, chars_per_token=cpt), n_ctx, 64, frozenset(), "m")
    last = estimate_tokens(generate(spec).turns[-1].messages, cpt)
    assert last + 64 <= n_ctx, (spec, last)


def test_given_turns_are_kept_or_refused_with_what_fits() -> None:
    kept, line = fit_to_context(WorkloadSpec(turns=6, chars_per_token=1.0), 32768, 64, frozenset({"turns"}), "tiny")
    assert kept.turns == 6 and line is not None and "turns" not in line.split(":")[1]
    assert last_turn_tokens(kept) + 64 <= 32768
    with pytest.raises(
        XoverError, match=r"--turns 30: each turn adds at least about 1,500 tokens .* at most 16 turns fit"
    ):
        fit_to_context(WorkloadSpec(turns=30, chars_per_token=1.0), 32768, 64, frozenset({"turns"}), "tiny")
    assert MIN_TURN_CHARS == 1500
    sixteen, _ = fit_to_context(WorkloadSpec(turns=16, chars_per_token=1.0), 32768, 64, frozenset({"turns"}), "tiny")
    assert sixteen.turns == 16 and last_turn_tokens(sixteen) + 64 <= 32768


def test_given_target_beyond_the_context_is_refused_with_what_fits() -> None:
    with pytest.raises(
        XoverError,
        match=r"--target-tokens 40,960 plus 64 response tokens exceed tiny's training context "
        r"of 32,768 tokens: at most 32,704 fit",
    ):
        fit_to_context(WorkloadSpec(), 32768, 64, frozenset({"target_tokens"}), "tiny")
    kept, _ = fit_to_context(WorkloadSpec(system_tokens=2048), 32768, 64, frozenset({"system_tokens"}), "tiny")
    assert kept.system_tokens == 2048  # a given system prompt is kept while the target scales


def test_model_context_reads_the_header(tiny: Path) -> None:
    ctx = model_context(tiny)
    assert (ctx.n_ctx_train, ctx.byte_vocab) == (32768, True) and "tiny-moe" in ctx.name


# ---- item 1: lengths beyond the context name those that fit ---------------------------------------


def test_context_advice_names_the_lengths_that_fit() -> None:
    assert fitting_lengths((1024, 4096, 16384, 32768), 200, 32768) == (1024, 4096, 16384)
    assert fitting_lengths((1024, 65536), 200, 0) == (1024, 65536)
    line = context_advice("tiny", 32768, (1024, 4096, 16384, 32768), 200, "--lengths", "response tokens")
    assert line == (
        "--lengths 32k with 200 response tokens exceeds tiny's training context of 32,768 tokens: "
        "of those given, --lengths 1k,4k,16k fit (any length up to 32,568 tokens does)"
    )
    none = context_advice("tiny", 4096, (8192, 16384), 200, "--lengths", "response tokens")
    assert none.endswith("none of them fits; any length up to 3,896 tokens does")


def test_check_offload_and_context_with_lengths(tiny: Path) -> None:
    check_offload_and_context(tiny, [0, 4], lengths=(1024, 32000), extra_tokens=200)
    with pytest.raises(XoverError, match="of those given, --lengths 1k fit"):
        check_offload_and_context(tiny, [0], lengths=(1024, 32768), extra_tokens=200)
    with pytest.raises(XoverError, match="at most 32,768 tokens fit"):
        check_offload_and_context(tiny, [0], 40000)


# ---- item 1: advise's agentic band ------------------------------------------------------------------


def _advise_spec(model: Path, ubatches: tuple[str, ...] = ("1024", "2048", "4096")):  # type: ignore[no-untyped-def]
    from xover.analysis import advise as adv
    from xover.measure.advise import AdviseSpec

    knobs = adv.with_candidates(adv.default_knobs(2), "ubatch-size", ubatches)
    return AdviseSpec(model=model, knobs=knobs)


def test_advise_band_scales_to_the_context(tiny: Path) -> None:
    from xover.measure.advise import _agentic_for_context

    spec = _advise_spec(tiny)
    band, line = _agentic_for_context(spec, spec.chunk_tokens)
    assert max(band.lengths) + 4096 + 64 <= 32768 and len(band.lengths) == 4
    assert line.startswith("the 10K-40K band scaled to xover synthetic tiny-moe's training context of 32,768 tokens")


def test_advise_band_on_a_context_too_small_for_the_prefill_test(tmp_path: Path) -> None:
    from xover.domain.presets import make_shape
    from xover.gguf.synth import write_model
    from xover.measure.advise import _agentic_for_context

    small = write_model(make_shape("tiny-moe", n_ctx_train=4096), tmp_path / "small.gguf").path
    spec = _advise_spec(small)
    with pytest.raises(XoverError, match="leaves no room for the agentic band after the 4096-token prefill test"):
        _agentic_for_context(spec, spec.chunk_tokens)
    fits = _advise_spec(small, ("1024", "2048"))
    band, _ = _agentic_for_context(fits, fits.chunk_tokens)
    assert max(band.lengths) + 2048 + 64 <= 4096


def test_advise_cli_leaves_out_ubatches_above_half_the_context(tmp_path: Path) -> None:
    from xover.analysis.advise import default_knobs
    from xover.measure.advise import ubatches_that_fit

    knobs, line = ubatches_that_fit(default_knobs(2), 4096, "small")
    assert next(k for k in knobs if k.name == "ubatch-size").candidates == ("1024", "2048")
    assert line == "-ub 4096 left out: more than half of small's training context of 4,096 tokens (--ubatch to choose)"
    assert ubatches_that_fit(default_knobs(2), 32768, "tiny") == (default_knobs(2), None)


# ---- item 2: -R / --response-tokens everywhere ------------------------------------------------------


@pytest.mark.parametrize("name", ["ttft", "session", "advise", "report", "theory", "predict"])
def test_every_command_with_a_response_length_takes_R_and_response_tokens(name: str) -> None:
    from xover.cli import cli

    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    option = next(p for p in command.params if isinstance(p, click.Option) and "--response-tokens" in p.opts)
    assert "-R" in option.opts


def test_theory_keeps_its_old_long_spelling() -> None:
    from xover.cli import cli

    command = cli.get_command(click.Context(cli), "theory")
    assert command is not None
    option = next(p for p in command.params if isinstance(p, click.Option) and "-R" in p.opts)
    assert set(option.opts) == {"-R", "--response-tokens", "--response"}


# ---- item 4: warnings that rest on facts -----------------------------------------------------------


def _point(ttft_ms: float, gap_ms: float) -> PointSummary:
    return PointSummary(
        config_key="k",
        mode="cold",
        length=4096,
        n_samples=3,
        n_ok=3,
        n_reps=3,
        n_reruns=0,
        n_errors=0,
        n_first_two_together=0,
        ttft_ns=summarize([ttft_ms * 1e6]),
        prefill_tps_client=None,
        prefill_tps_server=None,
        decode_tps_client=None,
        decode_tps_server=None,
        gap_ns=summarize([gap_ms * 1e6]),
    )


def test_url_gap_warning_rests_on_the_reported_slots() -> None:
    p = _point(30_000.0, 1100.0)
    one = gap_note(p, "http://x", None, slots=1)
    assert one is not None and "reports 1 slot (/props) but not whether --cache-ram is on" in one
    assert "several slots" not in one and "start it with --cache-ram 0" in one
    four = gap_note(p, "http://x", None, slots=4)
    assert four is not None and "reports 4 slots (/props)" in four and "-np 1 --cache-ram 0" in four
    unknown = gap_note(p, "http://x", None, slots=None)
    assert unknown is not None and "reports neither its slots nor --cache-ram" in unknown and "unknown" in unknown
    managed = gap_note(p, "ncmoe=12", True)
    assert managed is not None and "one slot and no prompt cache" in managed


@pytest.mark.parametrize("n_slots", [1, 3])
def test_url_run_records_the_slots_the_server_reports(tmp_path: Path, n_slots: int) -> None:
    plan = TtftPlan(lengths=(32,), reps=1, response_tokens=4, seed=1)
    with FakeLlamaServer(n_slots=n_slots) as fake, Store(tmp_path) as store:
        out = asyncio.run(TtftRun(store, plan, ["test"]).run_url(fake.url))
    (key,) = out.labels
    assert out.slots[key] == n_slots
    assert out.cold_cache[key] is None  # xover did not start it: what it knows is what /props says


@pytest.mark.parametrize(
    "spec",
    [
        WorkloadSpec(seed=0, turns=30, system_tokens=3840, target_tokens=15360, chars_per_token=4.0),
        WorkloadSpec(seed=1, turns=25, system_tokens=9664, target_tokens=38656, chars_per_token=1.0),
    ],
)
def test_a_file_edited_down_to_one_function_can_be_edited_again(spec: WorkloadSpec) -> None:
    """These sizes crashed the generator (a second edit of a file a delete had left with one function)."""
    session = generate(spec)
    assert len(session.turns) == spec.turns
    assert session == generate(spec)


def test_advise_time_estimate_grows_with_depth_as_the_probe_says() -> None:
    """The plan prices a process by an estimate from two probed depths: a model whose prefill slows 20x by 28K
    tokens (tiny-moe on 2 cores) gets a smaller band under the same budget than depth 0 alone says."""
    from xover.analysis import advise as adv
    from xover.measure.advise import _measurement_seconds

    flat = _measurement_seconds({0: 9500.0, 6912: 9500.0}, {0: 4800.0, 6912: 4800.0}, 4096, 64, 3)
    steep = _measurement_seconds({0: 9500.0, 6912: 2000.0}, {0: 4800.0, 6912: 900.0}, 4096, 64, 3)
    band = adv.uniform_workload((6912, 14080, 20992, 28160), 200)
    depths = band.depths()
    assert flat(depths) == pytest.approx(sum(2 * d / 9500 + 4 * (4096 / 9500 + 64 / 4800) for d in depths))
    assert steep(depths) > 5 * flat(depths)

    def planned(seconds):  # type: ignore[no-untyped-def]
        return adv.plan_search(
            band, (), lambda k, v: 1.0, lambda w, p: 1 + seconds(w.depths(p)), lambda w, p: 0.0, 60.0, scalable=True
        )

    assert max(planned(flat).depths) == 28160 and max(planned(steep).depths) < 28160
