"""Shrink the prefill penalty: find the llama.cpp settings with the lowest expected time per turn,
with few measurements. Pure: measurements arrive through an injected ``measure(setting)``;
:mod:`xover.measure.advise` does the I/O.

**Objective.** A workload is a distribution of turns (prompt ``L`` tokens, response ``R`` tokens,
weight ``w``). The expected time per turn is ``sum w (TTFT(L) + R / decode_tps(L)) / sum w``, the
total of :mod:`xover.analysis.crossover` averaged over the workload.

**The cheap measurement (llama-bench).** Each configuration runs ``pp{P} @ dN`` (P new prompt tokens
on top of N cached ones) and ``tg{T} @ dN`` at the depths ``0`` and the workload's representative
lengths. From them:

* ``TTFT(L) ~ integral from 0 to L of s(x) dx``, where ``s(x)`` is the prefill time per token at depth
  x. The test at depth N gives ``s = 1 / pp_tps`` at ``x = N + P/2`` (the middle of its chunk);
  ``s`` is linear between those points (attention makes the cost per token grow linearly with
  depth), constant before the first, and continues the last segment's slope after the last (flat if
  that slope is negative: noise). The approximation: a cold prompt is prefilled chunk by chunk, each
  chunk costing what a P-token llama-bench test costs at its depth. It leaves out the prompt's last,
  partial ubatch (fewer tokens per expert copy), tokenization and HTTP; the server confirmation
  (``xover advise --confirm``) measures the real TTFT of the winner against the defaults.
* ``decode_tps(L)``: time per token interpolated linearly in depth between the ``tg`` tests.

**The search.** One knob at a time from llama.cpp's defaults (coordinate search):

1. measure the defaults;
2. for each knob, measure each candidate value with every other knob at its default; a candidate that
   llama.cpp would run as its default anyway (the value the defaults' own llama-bench record reports,
   e.g. the default thread count) is skipped;
3. measure the defaults again (:data:`RECHECK`): the drift between the two measurements is load that
   changed while the search ran, and it joins the noise band;
4. per knob, the best value beats the defaults by more than the noise, or the default stays;
5. a best value whose gain is less than :data:`CLEAR_MARGIN` times its noise band is measured again in a fresh
   process (the process is the unit of evidence: one process can land on a quiet moment of the machine). It is
   kept only when the mean of its two processes beats the mean of the defaults' two by more than the noise,
   which then is at least the difference between its own two processes and the defaults' two, added;
6. measure the kept values together when they change two knobs or more (one knob: already measured);
7. recommend the fastest of the defaults, the kept values alone and together, or the defaults when that one
   is within noise of them.

Measurements: ``2 + candidates (less those skipped) + marginal winners + (1 if two or more knobs were kept)``
(the last one only when the kept values together differ from every configuration already measured).

**Noise.** Each configuration's objective is computed once per repetition (the i-th sample of every
test) and once from the tests' medians. Its spread is ``max - min`` of the per-repetition values. Two
configurations differ beyond noise when ``|difference| > max(spread_a, spread_b, drift)``, the drift being
``|defaults again - defaults|``; a knob has *no effect on this hardware* when every value tried is within
noise of the defaults. With one repetition the spread is 0: use two or more.

**Modules.** :mod:`.knobs` (the settings searched and the configuration that runs them), :mod:`.workload`,
:mod:`.objective` (a measurement's expected time per turn, and the noise rule), :mod:`.search`,
:mod:`.theory_notes` (the theory's note per trial), :mod:`.crossovers` (offload levels' crossover revisited),
:mod:`.confirm` (llama-server's check of the winner), :mod:`.applicability` (which knobs can act here, and why a
knob is skipped) and :mod:`.advice` (the stored record). This package
re-exports their public names, so ``advise.coordinate_search`` and ``from xover.analysis.advise import Knob`` work.
"""

from xover.analysis.advise.advice import ARTIFACT, SCHEMA, Advice, advice_from_dict
from xover.analysis.advise.applicability import (
    Context,
    backend_reason,
    batch_reason,
    cpu_experts,
    repacks,
    skip_reason,
    split,
    ubatch_reason,
)
from xover.analysis.advise.confirm import Confirmation, ServerPoint, confirmation, server_turn_s
from xover.analysis.advise.crossovers import RevisitedPair, config_data, revisit_crossovers
from xover.analysis.advise.knobs import (
    DEFAULTS,
    FLASH_ATTN,
    LLAMA_DEFAULT_BATCH,
    LLAMA_DEFAULT_UBATCH,
    RECHECK,
    RECHECK_ENV,
    Knob,
    Setting,
    again,
    apply_setting,
    default_knobs,
    first_of,
    is_again,
    knob_named,
    level_label,
    llama_config,
    normalize,
    option_knob,
    pairs_label,
    screenable,
    server_command,
    setting_label,
    study_knobs,
    with_candidates,
    with_values_to_try,
)
from xover.analysis.advise.objective import (
    Estimate,
    Measurement,
    RateSamples,
    curve_at,
    decode_s_per_token,
    decode_turn_s,
    estimate,
    ttft_s,
    within_noise,
)
from xover.analysis.advise.plan import SearchPlan, per_token_s, plan_search
from xover.analysis.advise.search import (
    CLEAR_MARGIN,
    SEARCH_SHARE,
    DepthPlan,
    Effect,
    KnobVerdict,
    Search,
    Trial,
    coordinate_search,
    depth_cost_s,
    plan_depths,
)
from xover.analysis.advise.theory_notes import THEORY_NO_EFFECT, Expectation, expectations, expected_turn_s
from xover.analysis.advise.workload import (
    AGENTIC_LENGTHS,
    REPRESENTATIVE_POINTS,
    Turn,
    Workload,
    agentic_workload,
    cached_workload,
    measurement_seconds,
    parse_workload,
    uniform_workload,
)

__all__ = [
    "SEARCH_SHARE",
    "DepthPlan",
    "depth_cost_s",
    "plan_depths",
    "backend_reason",
    "option_knob",
    "pairs_label",
    "decode_turn_s",
    "Context",
    "cpu_experts",
    "repacks",
    "skip_reason",
    "split",
    "batch_reason",
    "ubatch_reason",
    "AGENTIC_LENGTHS",
    "ARTIFACT",
    "DEFAULTS",
    "FLASH_ATTN",
    "LLAMA_DEFAULT_BATCH",
    "LLAMA_DEFAULT_UBATCH",
    "RECHECK",
    "RECHECK_ENV",
    "CLEAR_MARGIN",
    "again",
    "first_of",
    "is_again",
    "REPRESENTATIVE_POINTS",
    "SCHEMA",
    "THEORY_NO_EFFECT",
    "Advice",
    "Confirmation",
    "Effect",
    "Estimate",
    "Expectation",
    "Knob",
    "KnobVerdict",
    "Measurement",
    "RateSamples",
    "RevisitedPair",
    "Search",
    "ServerPoint",
    "Setting",
    "Trial",
    "Turn",
    "Workload",
    "advice_from_dict",
    "agentic_workload",
    "apply_setting",
    "config_data",
    "confirmation",
    "coordinate_search",
    "curve_at",
    "decode_s_per_token",
    "default_knobs",
    "estimate",
    "expectations",
    "SearchPlan",
    "plan_search",
    "screenable",
    "per_token_s",
    "expected_turn_s",
    "knob_named",
    "level_label",
    "llama_config",
    "measurement_seconds",
    "normalize",
    "parse_workload",
    "revisit_crossovers",
    "server_command",
    "server_turn_s",
    "setting_label",
    "study_knobs",
    "ttft_s",
    "cached_workload",
    "uniform_workload",
    "with_candidates",
    "with_values_to_try",
    "within_noise",
]
