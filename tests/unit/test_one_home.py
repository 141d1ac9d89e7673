"""One home per rule (issue 47): the rules that were written more than once live in one module each, and nothing in
`src` writes them again. Each check reads the sources as text or syntax: it fails on the tree before the change
(four token formatters, three cold/warm tuples, the report's own t arithmetic, the round planner in `measure`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import xover
from xover.analysis.rounds import RatioInterval, rounds_to_settle
from xover.domain.units import format_tokens, format_wait, token_arg

SRC = Path(xover.__file__).parent


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


def _outside_units(pattern: str) -> list[str]:
    """The modules of ``src`` but domain/units.py whose text matches ``pattern``."""
    return [name for name, text in _sources().items() if name != "domain/units.py" and re.search(pattern, text)]


def test_token_counts_are_formatted_in_one_module() -> None:
    # "32K" / "32k" / "1.5K": an f-string dividing by 1024 and appending K is a token formatter of its own
    assert _outside_units(r"/{1,2} ?1024(:[^}]*)?\}[kK]") == []
    assert [format_tokens(n) for n in (32768, 1536, 8000, 512)] == ["32K", "1,536", "8,000", "512"]
    assert [token_arg(n) for n in (32768, 1000)] == ["32k", "1000"]


def test_waits_are_formatted_in_one_module() -> None:
    # "2.5 min" from a minute on, else seconds: a formatter of the user's wait of its own (the verdict and the report
    # each had one, with different rules below a minute); a search's cost "about 1.5 min more" is another thing
    assert _outside_units(r'min" if [^\n]*>= ?60 else') == []
    assert [format_wait(s) for s in (150, -90, 12.34, -5)] == ["2.5 min", "-1.5 min", "12.3 s", "-5.0 s"]


def _tuples_of(text: str, items: tuple[str, ...]) -> int:
    found = 0
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) == len(items):
            values = tuple(e.value if isinstance(e, ast.Constant) else None for e in node.elts)
            found += values == items
    return found


def test_the_cold_and_warm_modes_are_one_tuple() -> None:
    places = {name: n for name, text in _sources().items() if (n := _tuples_of(text, ("cold", "warm")))}
    assert places == {"domain/records.py": 1}


def test_round_statistics_live_in_analysis_rounds() -> None:
    # the t quantile and the interval arithmetic: only analysis/rounds.py computes them
    users = [name for name, text in _sources().items() if name != "analysis/rounds.py" and "t975" in text]
    assert users == []
    # the round planner's question (which pairs are still open) is pure: in analysis, not measure
    assert not any("def open_questions" in text for name, text in _sources().items() if name.startswith("measure/"))


def test_rounds_to_settle_is_the_t_rule_run_forward() -> None:
    # 3 rounds, a 10% difference whose 95% interval (0.8-1.25) straddles 1: more rounds with the same spread settle it
    r = RatioInterval(ratio=1.1, low=0.95, high=1.1**2 / 0.95, n=3)
    n = rounds_to_settle(r)
    assert n is not None and n > 3
    # no difference at all, or none that 50 rounds could show: no number
    assert rounds_to_settle(RatioInterval(1.0, 0.9, 1.1, 3)) is None
    assert rounds_to_settle(RatioInterval(1.001, 0.5, 1.001**2 / 0.5, 3)) is None
