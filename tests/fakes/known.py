"""Known inputs shared by the unit and process tiers: a llama-bench -v log's buffer lines, qwen3-30b-a3b's terms
with the fit record of a configuration planned under a VRAM budget, and a two-configuration study spec."""

from __future__ import annotations

from xover.domain.study_spec import StudySpec, spec_from_dict
from xover.measure.fit import resolve_fits

VERBOSE_STDERR = """\
load_tensors: loading model tensors, this can take a while... (load_mode = none)
load_tensors:          CPU model buffer size =     1.26 MiB
load_tensors:   CPU_REPACK model buffer size =     3.20 MiB
llama_context:        CPU  output buffer size =     0.00 MiB
llama_kv_cache:        CPU KV buffer size =     0.50 MiB
sched_reserve:        CPU compute buffer size =     2.63 MiB
set_abort_callback: call
~llama_context:        CPU compute buffer size is   2.6318 MiB, matches expectation of   2.6318 MiB
llama_kv_cache:        CPU KV buffer size =     1.50 MiB
sched_reserve:        CPU compute buffer size =     5.76 MiB
sched_reserve:      CUDA0 compute buffer size =   342.01 MiB
load_tensors:        CUDA0 model buffer size =  9216.00 MiB"""


def qwen3_budget_records(budget: int, ctx: int) -> tuple[object, list[dict]]:
    """qwen3-30b-a3b's terms (from its preset, no file) and the fit record of a configuration planned at
    ``-ub 512`` under ``budget``."""
    from xover.analysis.theory import model_terms
    from xover.domain.presets import preset as get_preset
    from xover.domain.shapes import tensor_table

    terms = model_terms(tensor_table(get_preset("qwen3-30b-a3b")))
    spec = spec_from_dict(
        {
            "model": {"preset": "qwen3-30b-a3b"},
            "study": {"lengths": [ctx - 1024], "vram-budget": str(budget)},
            "config": [{"name": "fit", "n-cpu-moe": "fit"}],
        }
    )
    _, records = resolve_fits(spec, terms)
    return terms, records


def defaults_and_t1() -> StudySpec:
    """A study of llama.cpp's defaults and a configuration that runs ``-t 1``, on prompts of 512 tokens."""
    return spec_from_dict(
        {
            "model": {"preset": "tiny-moe"},
            "study": {"lengths": ["512"]},
            "config": [{"name": "defaults"}, {"name": "t=1", "threads": 1}],
        }
    )
