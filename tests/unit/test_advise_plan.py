"""Issue 68: `xover advise` plans its measurements within its budget before the first one, from rates it measured,
and shrinks the plan in a stated order: fewer depths, then the default band halved, then the values ranked lowest;
a budget that even the defaults alone cannot meet is refused before anything more is measured.

Known answers on constructed prices (a process costs 1 s plus 1 s per 1,000 tokens of depth it measures at, the
confirmation 10 s), on slow rates: the default agentic band at 10-40K tokens."""

from __future__ import annotations

import pytest

from xover.analysis import advise
from xover.analysis.advise import Knob, Workload
from xover.errors import XoverError

AGENTIC = advise.agentic_workload(200)  # 10K, 20K, 30K, 40K (10,240-40,960 tokens)
KNOBS = (
    Knob("ubatch-size", "-ub", "512", ("1024", "2048", "4096")),
    Knob("batch-size", "-b", "2048", ("4096",)),
    Knob("threads", "-t", "auto", ("1",)),
)
RANK = {("ubatch-size", "1024"): 1.2, ("ubatch-size", "2048"): 1.1, ("ubatch-size", "4096"): 1.05}


def rank(knob: Knob, value: str) -> float:
    return RANK.get((knob.name, value), 1.0)  # the theory expects nothing of -b and -t


def per_process(w: Workload, points: int) -> float:
    return 1 + sum(w.depths(points)) / 1000


def confirm(w: Workload, points: int) -> float:
    return 10.0


def plan(budget_s: float, scalable: bool = True) -> advise.SearchPlan:
    return advise.plan_search(AGENTIC, KNOBS, rank, per_process, confirm, budget_s, scalable=scalable)


def test_a_budget_that_holds_everything_leaves_nothing_out() -> None:
    p = plan(3600)
    assert p.points == 4 and p.depths == (0, 10240, 20480, 30720, 40960) and p.knobs == KNOBS and not p.left_out
    assert p.describe().startswith("plan: ub=1024/2048/4096, b=4096, t=1; depths 0, 10,240, 20,480, 30,720, 40,960;")
    assert p.processes == 3 + 5 + 2  # defaults, 5 values, defaults again, kept together, 2 second processes
    assert p.seconds == pytest.approx(10 * (1 + 102.4) + 10) and p.seconds <= 3600


def test_the_plan_shrinks_depths_first_then_the_band_then_the_values_ranked_lowest() -> None:
    full = plan(3600)
    # 1. fewer depths: the longest stays (time per token is linear in depth: 0 and the longest carry it)
    fewer = plan(600)
    assert fewer.depths == (0, 40960) and fewer.knobs == KNOBS and fewer.seconds <= 600 < full.seconds
    assert fewer.left_out == ("depths 0, 10,240, 20,480, 30,720, 40,960 measured at 0, 40,960 (fewer depths)",)
    # then the band halved, the values all kept
    halved = plan(150)
    assert halved.depths == (0, 10240) and halved.knobs == KNOBS and halved.seconds <= 150
    assert "the band halved 2 time(s) to agentic: uniform over 2,560, 5K, 7,680, 10K tokens" in halved.left_out[0]
    # the band at its floor (never below 512 tokens, here 512-2,560): -ub 4096 still acts (one ubatch a prompt
    # where 2048 runs two), so no ubatch leaves as running the same work
    tight = plan(30)
    assert min(tight.workload.lengths) >= 512 and max(tight.workload.lengths) == 2560 and tight.seconds <= 30
    assert len(tight.left_out) == 2
    # 2. fewer values: the lowest ranked leave first: -t 1 and -b 4096 (nothing expected of them; the later knob
    # first), then the ubatches from the least expected gain
    assert tight.left_out[-1] == "values t=1, b=4096, ub=4096, ub=2048 (ranked lowest)"
    assert tight.knobs == (Knob("ubatch-size", "-ub", "512", ("1024",)),)


def test_ubatches_that_run_every_prompt_as_one_ubatch_keep_only_the_smallest() -> None:
    """The tuning stage's rule (:func:`advise.ubatch_reason`): prompts of at most 1,024 tokens run as one ubatch at
    -ub 1024, 2048 and 4096 alike, so 2048 and 4096 leave and 1024 stays, whatever the budget."""
    short = advise.uniform_workload((512, 1024), 200)
    p = advise.plan_search(short, KNOBS, rank, per_process, confirm, 3600)
    assert {k.name: k.candidates for k in p.knobs}["ubatch-size"] == ("1024",)
    assert p.left_out == (
        "every request of this study prefills at most 1,024 tokens, one ubatch at -ub 1024: -ub 2048, 4096 would run "
        "the same ubatches",
    )


def test_a_workload_the_user_gave_is_measured_as_given_at_fewer_depths_at_most() -> None:
    p = plan(150, scalable=False)
    assert p.workload == AGENTIC and p.depths == (0, 40960) and p.seconds <= 150
    assert p.left_out[-1].endswith("(ranked lowest)")  # values left out, the band never halved


def test_a_budget_the_defaults_alone_cannot_meet_is_refused_in_one_line() -> None:
    with pytest.raises(XoverError) as e:
        plan(12)  # the defaults' 3 processes at the floor take more, with the 10 s confirmation
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--budget 12 s cannot hold even llama.cpp's defaults at depths 0, ")
    assert msg.endswith("or more, or shorter --lengths") and "give --budget 1m" in msg


SCREENABLE = (
    Knob("ubatch-size", "-ub", "512", ("1024", "2048", "4096"), record_field="n_ubatch"),
    Knob("batch-size", "-b", "2048", ("4096",), record_field="n_batch"),
    Knob("threads", "-t", "auto", ("1",), record_field="n_threads"),
)


def gpu_process(w: Workload, points: int) -> float:
    """A large model on a GPU build: 30 s of start-up and load a process, then its tests."""
    return 30 + sum(w.depths(points)) / 1000


def test_screening_comes_after_the_depths_and_before_any_value_leaves() -> None:
    """Step 2: where a process is mostly its start-up, each knob's values in one process keep every value that the
    ranking would otherwise drop. 300 s holds the band at its floor with -ub's three values screened in one
    process (8 processes, 276 s) where one process each leaves -t 1 and -b 4096 out (270 s)."""

    def at(budget: float, screen: bool) -> advise.SearchPlan:
        return advise.plan_search(AGENTIC, SCREENABLE, rank, gpu_process, confirm, budget, scalable=True,
                                  start_s=30, screenable=lambda k: screen and advise.screenable(k))  # fmt: skip

    roomy = at(3600, True)
    assert not roomy.screened and roomy.processes == 10  # screening only where the plan does not fit
    single, screened = at(300, False), at(300, True)
    assert [k.candidates for k in single.knobs] == [("1024", "2048", "4096")]
    assert single.left_out[-1] == "values t=1, b=4096 (ranked lowest)"
    assert screened.knobs == SCREENABLE and screened.screened == {
        "ubatch-size"
    }  # a knob of one value has nothing to share
    assert screened.left_out[0].startswith("depths 0, 10,240, 20,480, 30,720, 40,960 measured at 0, 2,560")
    assert screened.left_out[1] == "ub=1024/2048/4096 screened, each knob's values in one llama-bench process"
    # 3 defaults' processes, 1 screen of the 3 ubatches, b and t one each, 2 second processes: 8; the screen costs
    # one start-up and three values' tests
    assert screened.processes == 8 and screened.seconds == pytest.approx(7 * 32.56 + 30 + 3 * 2.56 + 10)
    # tighter still: screening first, then the lowest ranked value
    tight = at(250, True)
    assert tight.left_out[1:] == (
        "ub=1024/2048/4096 screened, each knob's values in one llama-bench process",
        "values t=1 (ranked lowest)",
    )


def test_only_a_knob_whose_records_tell_its_values_apart_is_screened() -> None:
    assert advise.screenable(SCREENABLE[0]) and advise.screenable(SCREENABLE[2])
    env = Knob("GGML_OP_OFFLOAD_MIN_BATCH", "GGML_OP_OFFLOAD_MIN_BATCH", "32", ("1024",), env=True)
    assert not advise.screenable(env)  # one process has one environment
