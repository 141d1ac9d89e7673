"""What a study measures once: configurations that ask llama.cpp the same (xover.measure.resume.distinct)."""

from __future__ import annotations

from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.measure.resume import distinct


def _spec(*configs: LlamaConfig, pairs: tuple[tuple[str, str], ...] = ()) -> StudySpec:
    return StudySpec(configs=configs, model_preset="tiny-moe", pairs=pairs)


def test_a_configuration_that_asks_the_same_as_an_earlier_one_is_measured_once_as_it() -> None:
    zero = LlamaConfig("ncmoe=0", (("n-cpu-moe", "0"),))
    short = LlamaConfig("short", (("n-cpu-moe", "0"),), max_context=1280)  # a fit@1k the planner placed at 0
    fit = LlamaConfig("fit", (("n-cpu-moe", "2"),))
    spec, same_as = distinct(_spec(zero, fit, short, pairs=(("short", "fit"),)))
    assert [c.name for c in spec.configs] == ["ncmoe=0", "fit"] and same_as == (("short", "ncmoe=0"),)
    assert spec.pairs == (("ncmoe=0", "fit"),) and spec.configs[0].max_context is None


def test_the_configuration_kept_is_placed_for_the_longer_context_of_the_two() -> None:
    short = LlamaConfig("short", (("n-cpu-moe", "0"),), max_context=1280)
    longer = LlamaConfig("long", (("n-cpu-moe", "0"),), max_context=8448)
    spec, same_as = distinct(_spec(short, longer))
    ((kept,),) = (spec.configs,)
    assert (kept.name, kept.max_context, same_as) == ("short", 8448, (("long", "short"),))


def test_distinct_configurations_are_left_alone() -> None:
    a = LlamaConfig("a", (("flash-attn", "on"),))
    b = LlamaConfig("b", (("flash-attn", "on"),), server_args=("--jinja",))  # passes llama-server more
    spec = _spec(a, b)
    assert distinct(spec) == (spec, ())
