"""The cache lab's plan, checked against llama-server's reuse logic ported from its source; the
analysis and the report section on constructed samples with known answers."""

from __future__ import annotations

import base64
import re

import pytest

from xover.domain.prompts import TokenPrompts
from xover.domain.records import ServerTimings, TtftSample
from xover.errors import XoverError
from xover.measure.cachelab import (
    APPENDED,
    CASES,
    INSERTED,
    MIN_LENGTH,
    PREFIX,
    SHORT,
    LabRequest,
    analyse,
    build_prompts,
    complete_scenarios,
    declared_state,
    lab_mode,
    lab_plan,
    parse_mode,
    plan_requests,
)
from xover.report.cache import cache_section_html, cache_section_markdown, lab_table
from xover.results.read_model import StudyData

L = 1024
GEN = -1  # stands for generated tokens in the simulated slot: never part of a prompt


def simulate(cache: list[int], new: list[int], n_reuse: int) -> tuple[int, int]:
    """llama-server's prompt reuse for one slot (tools/server/server-context.cpp, 0c1e570), ported
    loop for loop: the common prefix, then chunks of at least ``n_reuse`` tokens found in the old
    cache at the new prompt's current position; a full hit still evaluates one token."""
    n_past = 0
    while n_past < min(len(cache), len(new)) and cache[n_past] == new[n_past]:
        n_past += 1
    cache = list(cache)
    if n_reuse > 0:
        head_c = head_p = n_past
        while head_c < len(cache) and head_p < len(new):
            n_match = 0
            while (
                head_c + n_match < len(cache)
                and head_p + n_match < len(new)
                and cache[head_c + n_match] == new[head_p + n_match]
            ):
                n_match += 1
            if n_match >= n_reuse:
                for i in range(n_match):
                    cache[head_p + i] = cache[head_c + i]
                    n_past += 1
                head_c += n_match
                head_p += n_match
            else:
                head_c += 1
    if n_past == len(new) and n_past > 0:
        n_past -= 1
    return n_past, len(new) - n_past


def _prompts() -> TokenPrompts:
    return TokenPrompts(range(2, 700), seed=5)


def test_plan_predictions_match_llama_servers_reuse_logic() -> None:
    index = iter(range(10_000))
    checked = 0
    for srv in lab_plan(L):
        if srv.defaults:
            continue  # several slots and a host-memory cache: checked on the real server
        ids = build_prompts(srv, _prompts(), lambda: next(index))
        cache: list[int] = []
        for step in srv.steps:
            if not isinstance(step, LabRequest):
                cache = []  # every slot erased
                continue
            reuse = step.n_cache_reuse if step.n_cache_reuse is not None else srv.cache_reuse or 0
            assert simulate(cache, list(ids[step]), reuse) == step.expect, step.mode
            cache = [*ids[step], *[GEN] * 8]
            checked += 1
    assert checked == 2 + 8 + 5


def test_plan_geometry() -> None:
    plan = plan_requests(L)
    half = (L - PREFIX) // 2
    assert {r.length for (case, req), r in plan.items() if req in ("original", "first")} == {L}
    assert plan[("edit-insert", "edited")].length == L + INSERTED
    assert plan[("edit-insert", "edited")].common_prefix == PREFIX + half
    move = plan[("edit-move", "edited")]
    assert move.expect == (PREFIX + L - PREFIX - half, APPENDED) and move.common_prefix == PREFIX
    assert move.n_cache_reuse is None  # the server's --cache-reuse applies
    assert plan[("edit-move-noreuse", "edited")].n_cache_reuse == 0
    assert plan[("edit-move-short", "edited")].expect == (PREFIX, SHORT + APPENDED)
    assert plan[("hidden-defaults", "again")].expect == (L - 1, 1)
    assert plan[("hidden-cold", "again")].expect == (0, L)
    assert plan[("resend", "resend")].expect == (L - 1, 1)


def test_prompts_share_chunks_within_a_case_only() -> None:
    index = iter(range(10_000))
    by_mode: dict[str, tuple[int, ...]] = {}
    for srv in lab_plan(L):
        for req, ids in build_prompts(srv, _prompts(), lambda: next(index)).items():
            assert len(ids) == req.length
            by_mode[req.mode] = ids
    assert by_mode["cache:hidden-cold:again"] == by_mode["cache:hidden-cold:first"]
    assert by_mode["cache:resend:resend"] == by_mode["cache:resend:first"]
    original, edited = by_mode["cache:edit-move:original"], by_mode["cache:edit-move:edited"]
    assert edited[:PREFIX] == original[:PREFIX] and edited[PREFIX] != original[PREFIX]
    assert edited[PREFIX:-APPENDED] == original[-(len(edited) - PREFIX - APPENDED) :]
    firsts = [ids[0] for mode, ids in by_mode.items() if mode.endswith((":original", ":first"))]
    assert len(set(firsts)) == len(firsts)  # no two cases share a prefix


def test_plan_rejects_short_prompts_in_one_line() -> None:
    with pytest.raises(XoverError, match=r"at least 1024 tokens.*raise --length") as e:
        lab_plan(MIN_LENGTH - 1)
    assert "\n" not in str(e.value)


def test_modes_and_claims() -> None:
    assert parse_mode(lab_mode("edit-move", "edited")) == ("edit-move", "edited")
    assert parse_mode("cold") is None and parse_mode("cache:x") is None and parse_mode("cache::y") is None
    assert declared_state("resend", "first") == "cold"
    assert declared_state("hidden-defaults", "other-2") == "cold"
    assert declared_state("resend", "resend") == "warm"
    assert declared_state("hidden-cold", "again") == "cold"
    assert declared_state("hidden-defaults", "again") is None  # the hidden cache hit is the finding
    assert declared_state("edit-move", "edited") is None


# ---- analysis and report on constructed samples --------------------------------------------------


def _sample(
    mode: str, length: int, cache_n: int, prompt_n: int, ttft_ms: float, prompt_ms: float, error: str | None = None
) -> TtftSample:
    ttft = round(ttft_ms * 1e6)
    return TtftSample(
        config_key="k",
        mode=mode,
        length=length,
        rep=0,
        prompt_id=f"lab:{mode}",
        sent_at_unix_ns=0,
        first_byte_ns=ttft - 10,
        first_token_ns=ttft,
        end_ns=ttft + 10**6,
        token_times_ns=(ttft,),
        n_tokens_received=1,
        timings=ServerTimings(cache_n, prompt_n, prompt_ms, None, 8, 1.0, None),
        cache_ok=error is None,
        error=error,
    )


def _as_predicted(label: str = "cfg", scale: float = 1.0) -> list[tuple[str, TtftSample]]:
    """Every planned request answered exactly as predicted; TTFT = prompt_n ms (+1 ms gap), others 5 ms gap."""
    out = []
    for srv in lab_plan(L):
        for r in srv.requests():
            gap = 5.0 if r.request.startswith("other-") and srv.defaults else 1.0
            out.append((label, _sample(r.mode, r.length, *r.expect, r.expect[1] * scale + gap, r.expect[1] * scale)))
    return out


def test_analysis_of_a_lab_that_went_as_predicted() -> None:
    a = analyse(_as_predicted())
    assert len(a.rows) == 20 and all(r.ok for r in a.rows)
    assert a.row("cfg", "resend", "resend").verdict == "from the slot (cache_n = L-1): 512x faster than cold"  # type: ignore[union-attr]
    assert a.row("cfg", "edit-move", "edited").verdict == "reuse kept 480 tokens past the edit; 64 prefilled"  # type: ignore[union-attr]
    assert a.row("cfg", "edit-insert", "edited").verdict.startswith(
        "no reuse: all 512 tokens after the common prefix (544)"
    )  # type: ignore[union-attr]
    assert a.row("cfg", "hidden-defaults", "again").verdict.startswith("should be cold, but came from a hidden cache")  # type: ignore[union-attr]
    assert a.row("cfg", "hidden-cold", "again").verdict == "cold: no hidden cache"  # type: ignore[union-attr]
    assert a.row("cfg", "hidden-cold", "other-1").gap_ns == 10**6  # type: ignore[union-attr]
    text = "\n".join(a.headlines)
    assert "TTFT 1,025.0 ms cold, 2.0 ms from the slot (512x)" in text
    assert (
        "--cache-reuse 256 gave cache_n 544, prompt_n 64" in text and "cache_n 64, prompt_n 544 without reuse" in text
    )
    assert "inserted mid-prompt: nothing reused past the common prefix (common prefix 544" in text
    assert "cache_n 1023 of 1,024 with default settings, 0 with -np 1 --cache-ram 0" in text
    assert "5.0 ms with default settings" in text and "vs 1.0 ms with -np 1 --cache-ram 0" in text


def test_analysis_flags_what_went_otherwise() -> None:
    samples = _as_predicted()
    for i, (label, s) in enumerate(samples):
        if s.mode == "cache:hidden-cold:again":  # a cold-mode server that leaked anyway
            samples[i] = (label, _sample(s.mode, L, L - 1, 1, 3.0, 2.0))
        elif s.mode == "cache:edit-move:edited":  # reuse did not happen
            samples[i] = (label, _sample(s.mode, s.length, PREFIX, s.length - PREFIX, 50.0, 49.0))
        elif s.mode == "cache:resend:first":
            samples[i] = (label, _sample(s.mode, L, 100, L - 100, 50.0, 49.0))
    a = analyse(samples)
    bad = {(r.case, r.request): r for r in a.rows if not r.ok}
    assert set(bad) == {("hidden-cold", "again"), ("edit-move", "edited"), ("resend", "first")}
    assert (
        bad[("hidden-cold", "again")].verdict
        == "should be cold, but came from a hidden cache (cache_n = L-1) (predicted cache_n=0 prompt_n=1024)"
    )
    assert bad[("edit-move", "edited")].verdict.startswith("no reuse: all 544 tokens after the common prefix (64)")
    assert bad[("resend", "first")].verdict == "labelled cold but cache-assisted: cache_n=100 prompt_n=924"
    assert not any("resending" in h for h in a.headlines)  # no caching effect from a first request that was not cold


def test_a_rerun_replaces_the_earlier_groups_and_errors_are_kept() -> None:
    first = _as_predicted()
    again = _as_predicted(scale=2.0)
    err = ("cfg", _sample("cache:edit-move:edited", 608, 0, 0, 1.0, 1.0, error="stream broke"))
    a = analyse([*first, *again[:6], err])
    edit_move = [r for r in a.rows if r.case == "edit-move"]
    assert [r.request for r in edit_move] == ["original", "edited", "edited"]  # the rerun's group, with the error
    assert edit_move[-1].verdict == "error: stream broke" and not edit_move[-1].ok
    assert a.row("cfg", "resend", "first").ttft_ns == 2049 * 10**6  # type: ignore[union-attr]
    assert a.row("cfg", "hidden-cold", "first").ttft_ns == 1025 * 10**6  # type: ignore[union-attr]  # from the first run


def test_complete_scenarios_lets_an_interrupted_lab_resume_where_it_stopped() -> None:
    full = _as_predicted()
    assert complete_scenarios(full, "cfg", L) == set(CASES)
    assert complete_scenarios(full, "other", L) == set() and complete_scenarios(full, "cfg", L + 1) == set()
    # interrupted inside hidden-cold (as on the H200 run): its first requests are stored, "again" is not
    cut = [x for x in full if not x[1].mode.startswith(lab_mode("hidden-cold", "again"))]
    assert complete_scenarios(cut, "cfg", L) == set(CASES) - {"hidden-cold"}
    # a request that failed does not count as measured
    broken = [
        (lab, _sample(s.mode, s.length, 0, 0, 1.0, 1.0, error="boom") if s.mode == lab_mode("resend", "resend") else s)
        for lab, s in full
    ]
    assert "resend" not in complete_scenarios(broken, "cfg", L)


def test_requests_without_their_opening_request_are_shown_not_judged() -> None:
    a = analyse(
        [
            ("cfg", _sample("cache:edit-move:edited", 608, 544, 64, 5.0, 4.0)),
            ("cfg", _sample("cold", L, 0, L, 9.0, 8.0)),
        ]
    )
    (row,) = a.rows
    assert row.expect is None and not row.ok and row.verdict.startswith("not part of a complete lab run")


def _data(samples: list[tuple[str, TtftSample]]) -> StudyData:
    return StudyData(study_dir="s", runs=(), labels={}, bench=(), ttft=tuple(samples), failures=(), artifacts=())


def test_report_section_escapes_and_embeds_one_plot() -> None:
    hostile = "<script>alert(1)</script>"
    samples = _as_predicted(label=hostile) + _as_predicted(label="ncmoe=18")
    page = cache_section_html(_data(samples))
    assert hostile not in page and html_escaped(hostile) in page
    assert page.count("<img id='plot-cache-lab'") == 1
    png = base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)'", page).group(1))  # type: ignore[union-attr]
    assert png.startswith(b"\x89PNG")
    assert page.count("<tr>") == 1 + 40  # header + every request of both configurations
    header, rows = lab_table(analyse(samples))
    assert header[:3] == ["config", "scenario", "request"] and rows[0][:3] == [hostile, "resend", "first"]
    md = cache_section_markdown(_data(samples))
    assert md.startswith("## Prompt cache lab") and "| resend | resend | 1,024 | 2.0 | 1 | 1023 |" in md


def test_report_section_is_empty_without_lab_samples() -> None:
    data = _data([("cfg", _sample("cold", L, 0, L, 9.0, 8.0))])
    assert cache_section_html(data) == "" and cache_section_markdown(data) == ""


def html_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def test_the_host_cache_prediction_follows_its_size() -> None:
    from xover.measure.cachelab import CACHE_RAM_DEFAULT_BYTES, OTHERS, host_cache_note

    assert host_cache_note(32768, None) == (True, None)  # unknown state size: as before, the cache keeps it
    # qwen3-30b-a3b's F16 KV: 98,304 bytes per token -> 3 GiB per 32K prompt; 8 GiB hold 2, 3 are saved first
    keeps, note = host_cache_note(32768, 98_304)
    assert not keeps and note is not None and "holds 2 prompt state(s) of 3.00 GiB" in note and "evicted" in note
    # the limit: OTHERS states fit exactly
    per_token = CACHE_RAM_DEFAULT_BYTES // (OTHERS * 32768)
    assert host_cache_note(32768, per_token)[0] and not host_cache_note(32768, per_token + 1)[0]
    # the plan and the analysis use it: the defaults' "again" is predicted cold, and a cold answer is then as predicted
    plan = plan_requests(32768, 98_304)
    again = plan[("hidden-defaults", "again")]
    assert again.expect == (0, 32768) and again.note == note
    assert plan_requests(32768)[("hidden-defaults", "again")].expect == (32767, 1)
    samples = [("big", _sample(r.mode, r.length, *r.expect, 10.0, 9.0)) for r in plan.values()]
    a = analyse(samples, {"big": 98_304})
    row = a.row("big", "hidden-defaults", "again")
    assert row is not None and row.ok and row.verdict == "cold: " + note
    assert any(
        "cache_n 0 of 32,768 with default settings, 0 with -np 1 --cache-ram 0: cold: --cache-ram" in h
        for h in a.headlines
    )
    unknown = analyse(samples).row("big", "hidden-defaults", "again")
    assert unknown is not None and not unknown.ok and "predicted cache_n=32767" in unknown.verdict
