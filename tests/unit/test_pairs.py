"""One rule for the pairs a study's verdicts answer (issue 47 item 2): the study's extra rounds and the report's
verdicts read :func:`xover.analysis.pairs.told_pairs`. The old study rule also gave extra rounds to each
configuration against its own tuned variant, which the report never told."""

from __future__ import annotations

from xover.analysis.pairs import AT_BEST, AT_DEFAULTS, FOR_CACHED, FOR_DECODE, ONLY, TUNED, headline, told_pairs
from xover.domain.study_spec import spec_from_dict
from xover.measure.study import verdict_pairs


def test_the_rule_by_known_answers() -> None:
    heads = headline((), ["a", "b", "c"])
    assert heads == (("a", "b"),)
    tuned = {"a": "a tuned", "b": "b tuned"}
    assert told_pairs(heads, ["a", "b", "c"], tuned, {"a": "a for decode"}, True) == [
        (AT_DEFAULTS, "a", "b"),
        (AT_BEST, "a tuned", "b tuned"),
        (FOR_DECODE, "a tuned", "a for decode"),
    ]
    cached = told_pairs(heads, ["a", "b"], {}, {"b": "b cached"}, True, lambda d: d.endswith("cached"))
    assert cached == [(AT_DEFAULTS, "a", "b"), (AT_BEST, "a", "b"), (FOR_CACHED, "b", "b cached")]
    assert told_pairs(heads, ["a", "b"], {}, {}, False) == [(ONLY, "a", "b")]  # no tuning ran
    assert told_pairs((), ["a"], {"a": "a tuned"}, {}, True) == [(TUNED, "a", "a tuned")]  # what tuning buys


def test_the_study_gives_extra_rounds_to_exactly_the_pairs_the_report_tells() -> None:
    spec = spec_from_dict(
        {
            "model": {"preset": "tiny-moe"},
            "study": {"lengths": ["1k"]},
            "config": [{"name": "a"}, {"name": "b", "threads": 1}, {"name": "c", "threads": 2}],
        }
    )
    tuned, for_decode = {"a": "a tuned", "c": "c tuned"}, {"b": "b for decode"}
    told = told_pairs(headline((), ["a", "b", "c"]), ["a", "b", "c"], tuned, for_decode, True)
    assert verdict_pairs(spec, tuned, for_decode) == [(a, b) for _, a, b in told]
    assert ("a", "a tuned") not in verdict_pairs(spec, tuned, for_decode)  # the old rule's extra pair
