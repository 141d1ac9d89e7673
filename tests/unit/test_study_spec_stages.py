"""One list of a study's stages (issue 47 item 2): the spec's skip, --skip, --remeasure and the runner read it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xover.domain.study_spec import STAGE_ORDER, STAGES, spec_from_dict
from xover.errors import XoverError

SRC = Path(__file__).resolve().parents[2] / "src" / "xover"


def test_every_stage_the_runner_times_is_in_the_one_list_in_its_order() -> None:
    text = (SRC / "measure" / "study.py").read_text(encoding="utf-8")
    timed = list(dict.fromkeys(re.findall(r'self\.timed\("([a-z]+)"', text)))
    assert set(timed) == set(STAGE_ORDER)
    assert STAGES == STAGE_ORDER[1:] and STAGE_ORDER[0] == "model"


@pytest.mark.parametrize("stage", STAGES)
def test_a_spec_may_skip_every_stage_but_the_model(stage: str) -> None:
    doc = {"model": {"preset": "tiny-moe"}, "study": {"lengths": ["1k"], "skip": [stage]}, "config": [{"name": "a"}]}
    assert stage in spec_from_dict(doc).skip


def test_the_model_cannot_be_skipped_and_the_error_names_the_stages() -> None:
    doc = {"model": {"preset": "tiny-moe"}, "study": {"lengths": ["1k"], "skip": ["model"]}, "config": [{"name": "a"}]}
    with pytest.raises(XoverError, match="stages are theory, tune, bench, ttft, cache, session, report"):
        spec_from_dict(doc)
