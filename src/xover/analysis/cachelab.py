"""Prompt-cache lab: what llama-server's caches do to time-to-first-token, proven by cache_n/prompt_n.

Every scenario runs on a freshly started server of one configuration, after one discarded warm-up
request. Every request sends ``cache_prompt: true`` (what clients send by default) and streams
:data:`RESPONSE_TOKENS` tokens; every response's ``cache_n``/``prompt_n`` is compared with what
the plan predicts, and each request is stored as a TTFT sample with mode ``cache:<case>:<request>``.

* **resend** (``-np 1 --cache-ram 0``): a unique prompt of L tokens, then the same prompt again.
  The first is cold (cache_n 0, prompt_n L), the second comes from the slot (cache_n L-1,
  prompt_n 1); the ratio of their TTFTs is the caching effect on this hardware.
* **edit** (``--cache-reuse 256 -np 1 --cache-ram 0``): four cases, each an original prompt of L
  tokens (prefix P, chunks C1, C2) followed by an edited one, each case with fresh chunks:

  - ``edit-insert``: P C1 E C2, a small edit E inserted partway through;
  - ``edit-move-noreuse``: P C2 N (C1, e.g. a file read, dropped from the middle and its new
    version N appended), with ``n_cache_reuse: 0`` in the request;
  - ``edit-move``: the same edit with the server's ``--cache-reuse 256``;
  - ``edit-move-short``: the same edit where the chunk kept after the edit (S, 200 tokens) is
    shorter than the reuse threshold.
* **hidden-defaults** (llama-server's defaults: 4 slots, 8 GiB host-memory prompt cache) and
  **hidden-cold** (``-np 1 --cache-ram 0``), both with ``--slot-save-path`` so slots can be
  erased: prompt A, :data:`OTHERS` other prompts, erase every slot, A again. A naive client
  expects the last request to be cold. The other prompts' client TTFT minus server ``prompt_ms``
  shows what saving the previous slot's state to host memory adds to each new request.

How ``--cache-reuse`` works (``tools/server/server-context.cpp`` at 0c1e570): ``--cache-reuse N``
is the default of the per-request ``n_cache_reuse``; a request that sends the field overrides it
(0 turns reuse off). After the common prefix, the server walks the old cache for a run of at least
N tokens matching the new prompt *at its current position*, shifts that run's KV into place and
counts it in cache_n; the new prompt's position advances only on such a match. So a span removed
from the middle (what follows moves up) is reused, but tokens inserted at the edit point never
match and end the search: an insertion re-prefills everything after it, reuse or not.

The plan and the analysis, pure; :mod:`xover.measure.cachelab` runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from xover.analysis.stats import summarize
from xover.domain.prompts import TokenPrompts
from xover.domain.records import TtftSample
from xover.errors import XoverError

MODE_PREFIX = "cache:"
REUSE_MIN = 256  # --cache-reuse: the maintainers' suggested starting value
PREFIX = 64  # tokens every edit case shares from the start (a system prompt)
INSERTED = 32  # tokens of the edit inserted mid-prompt
APPENDED = 64  # new tokens appended after a span is dropped
SHORT = REUSE_MIN - 56  # a kept chunk shorter than the reuse threshold
OTHERS = 3  # other prompts between A and A again in the hidden-cache scenarios
RESPONSE_TOKENS = 8
MIN_LENGTH = 1024  # so the chunk kept after an edit is well above REUSE_MIN
CACHE_RAM_DEFAULT_BYTES = 8192 << 20  # llama-server's --cache-ram default (MiB)
STATE_ARTIFACT = "cache-lab-state"  # {label, length, state_bytes_per_token}: what the predictions used
CASES = ("resend", "edit-insert", "edit-move-noreuse", "edit-move", "edit-move-short", "hidden-defaults", "hidden-cold")
OPENING = ("first", "original")  # the request that starts each case


# ---- the plan (pure) ----------------------------------------------------------------------------


def lab_mode(case: str, request: str) -> str:
    """The stored ``mode`` of a lab request: ``cache:<case>:<request>``."""
    return f"{MODE_PREFIX}{case}:{request}"


def parse_mode(mode: str) -> tuple[str, str] | None:
    """(case, request) of a lab mode; None for any other mode (``cold``, ``warm``)."""
    if not mode.startswith(MODE_PREFIX):
        return None
    case, sep, request = mode[len(MODE_PREFIX) :].partition(":")
    return (case, request) if sep and case and request else None


def declared_state(case: str, request: str) -> str | None:
    """What a lab request claims: ``cold`` (cache_n 0, prompt_n L), ``warm`` (cache_n L-1,
    prompt_n 1) or None for a demonstration whose outcome is the finding (an edited prompt, a
    resend on default settings)."""
    if request in OPENING or request.startswith("other-") or (case == "hidden-cold" and request == "again"):
        return "cold"
    if request == "resend":
        return "warm"
    return None


Segment = tuple[str, int]  # (chunk name, tokens): within a case, a name always means the same tokens


@dataclasses.dataclass(frozen=True)
class LabRequest:
    """One measured request and the cache state llama-server's logic predicts for it."""

    case: str
    request: str
    segments: tuple[Segment, ...]
    expect: tuple[int, int]  # (cache_n, prompt_n)
    common_prefix: int | None = None  # edited prompts: tokens shared with the original from the start
    n_cache_reuse: int | None = None  # sent in the request when set; otherwise the server's --cache-reuse applies
    note: str | None = None  # why the prediction is what it is, where that is not obvious

    @property
    def length(self) -> int:
        return sum(n for _, n in self.segments)

    @property
    def mode(self) -> str:
        return lab_mode(self.case, self.request)


@dataclasses.dataclass(frozen=True)
class EraseSlots:
    """``POST /slots/{id}?action=erase`` for every slot of the server."""


LabStep = LabRequest | EraseSlots


@dataclasses.dataclass(frozen=True)
class LabServer:
    """One freshly started server and what is sent to it."""

    scenario: str
    settings: str  # the cache settings, as a person reads them
    defaults: bool  # llama-server's cache defaults instead of -np 1 --cache-ram 0
    cache_reuse: int | None  # --cache-reuse
    slot_save: bool  # --slot-save-path (erasing a slot needs it)
    steps: tuple[LabStep, ...]

    def requests(self) -> tuple[LabRequest, ...]:
        return tuple(s for s in self.steps if isinstance(s, LabRequest))


def _cold(case: str, request: str, segments: tuple[Segment, ...]) -> LabRequest:
    n = sum(size for _, size in segments)
    return LabRequest(case, request, segments, expect=(0, n))


def host_cache_note(length: int, state_bytes_per_token: int | None) -> tuple[bool, str | None]:
    """Whether llama-server's host prompt cache (``--cache-ram``, default 8 GiB) still holds the first prompt
    of the hidden-cache scenario when it is sent again, and why.

    Each new request saves the previous prompt's state (its KV cache) there first, and the cache drops
    its oldest entries to make room (``server_prompt_cache::alloc``, server-task.cpp). Before "again",
    the first prompt and the first ``OTHERS - 1`` others are saved (the last one is erased with its
    slot): the first survives when those ``OTHERS`` states fit together. Unknown state size: assume so.
    """
    if state_bytes_per_token is None:
        return True, None
    state = length * state_bytes_per_token
    fits = max(0, CACHE_RAM_DEFAULT_BYTES // state) if state else OTHERS
    keeps = OTHERS * state <= CACHE_RAM_DEFAULT_BYTES
    size = f"{state / 2**30:.2f} GiB" if state >= 2**30 else f"{state / 2**20:.1f} MiB"
    what = "so the first is still there" if keeps else "so the first was evicted to make room"
    return keeps, (
        f"--cache-ram's 8 GiB holds {fits} prompt state(s) of {size}; {OTHERS} are saved before the "
        f"prompt comes again, {what}"
    )


def lab_plan(length: int, state_bytes_per_token: int | None = None) -> tuple[LabServer, ...]:
    """Every server and request of the lab for prompts of ``length`` tokens; ``state_bytes_per_token``
    (the KV cache's) sizes the host prompt cache's prediction (:func:`host_cache_note`)."""
    if length < MIN_LENGTH:
        raise XoverError(
            f"the cache lab needs prompts of at least {MIN_LENGTH} tokens (got {length}), so the chunk kept "
            f"after an edit is well above the --cache-reuse threshold {REUSE_MIN}: raise --length"
        )
    L = length
    half = (L - PREFIX) // 2
    p, c1, c2 = ("P", PREFIX), ("C1", half), ("C2", L - PREFIX - half)
    e, n, s = ("E", INSERTED), ("N", APPENDED), ("S", SHORT)
    a = (("A", L),)

    def edit(
        case: str,
        kept: Segment,
        edited: tuple[Segment, ...],
        expect: tuple[int, int],
        common: int,
        reuse: int | None = None,
    ) -> tuple[LabRequest, LabRequest]:
        first = _cold(case, "original", (p, (c1[0], L - PREFIX - kept[1]), kept))
        return first, LabRequest(case, "edited", edited, expect, common_prefix=common, n_cache_reuse=reuse)

    def hidden(case: str, defaults: bool) -> LabServer:
        others = tuple(_cold(case, f"other-{i}", ((f"B{i}", L),)) for i in range(1, OTHERS + 1))
        keeps, note = host_cache_note(L, state_bytes_per_token) if defaults else (False, None)
        again = LabRequest(case, "again", a, expect=(L - 1, 1) if keeps else (0, L), note=note)
        settings = "defaults (-np auto, --cache-ram 8 GiB)" if defaults else "-np 1 --cache-ram 0"
        return LabServer(
            case,
            f"{settings}, --slot-save-path",
            defaults,
            None,
            True,
            (_cold(case, "first", a), *others, EraseSlots(), again),
        )

    return (
        LabServer(
            "resend",
            "-np 1 --cache-ram 0",
            False,
            None,
            False,
            (_cold("resend", "first", a), LabRequest("resend", "resend", a, expect=(L - 1, 1))),
        ),
        LabServer(
            "edit",
            f"--cache-reuse {REUSE_MIN}, -np 1 --cache-ram 0",
            False,
            REUSE_MIN,
            False,
            (
                *edit("edit-insert", c2, (p, c1, e, c2), (PREFIX + half, INSERTED + c2[1]), PREFIX + half),
                *edit("edit-move-noreuse", c2, (p, c2, n), (PREFIX, c2[1] + APPENDED), PREFIX, reuse=0),
                *edit("edit-move", c2, (p, c2, n), (PREFIX + c2[1], APPENDED), PREFIX),
                *edit("edit-move-short", s, (p, s, n), (PREFIX, SHORT + APPENDED), PREFIX),
            ),
        ),
        hidden("hidden-defaults", True),
        hidden("hidden-cold", False),
    )


def plan_requests(length: int, state_bytes_per_token: int | None = None) -> dict[tuple[str, str], LabRequest]:
    """(case, request) -> the planned request, for prompts of ``length`` tokens."""
    return {(r.case, r.request): r for srv in lab_plan(length, state_bytes_per_token) for r in srv.requests()}


def build_prompts(
    server: LabServer, prompts: TokenPrompts, index: Callable[[], int]
) -> dict[LabRequest, tuple[int, ...]]:
    """Token ids of every request of ``server``: each (case, chunk) drawn once from ``prompts``
    under a fresh index, so chunks start with distinct tokens and common prefixes are exact."""
    chunks: dict[tuple[str, str], tuple[int, ...]] = {}
    out = {}
    for r in server.requests():
        ids: list[int] = []
        for name, size in r.segments:
            if (r.case, name) not in chunks:
                chunk = prompts.make(index(), size).prompt
                assert isinstance(chunk, tuple)  # TokenPrompts make token ids
                chunks[(r.case, name)] = chunk
            ids += chunks[(r.case, name)]
        out[r] = tuple(ids)
    return out


# ---- analysis (pure) ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LabRow:
    """One lab request as shown in the table."""

    label: str
    case: str
    request: str
    length: int
    ttft_ns: int | None
    cache_n: int | None
    prompt_n: int | None
    prompt_ms: float | None
    gap_ns: int | None  # client TTFT - server prompt_ms
    expect: tuple[int, int] | None  # None: the case's opening request is missing, nothing to compare with
    common_prefix: int | None  # edited prompts: tokens shared with the original from the start
    verdict: str

    @property
    def ok(self) -> bool:
        """The server did what the lab predicts (cache_n and prompt_n exactly)."""
        return self.expect is not None and (self.cache_n, self.prompt_n) == self.expect


@dataclasses.dataclass(frozen=True)
class LabAnalysis:
    rows: tuple[LabRow, ...]
    headlines: tuple[str, ...]  # the findings, one sentence each, from the numbers

    def row(self, label: str, case: str, request: str) -> LabRow | None:
        return next((r for r in self.rows if (r.label, r.case, r.request) == (label, case, request)), None)


def lab_samples(samples: Sequence[tuple[str, TtftSample]]) -> list[tuple[str, TtftSample]]:
    """The (label, sample) pairs that came from the lab, in stored order."""
    return [(label, s) for label, s in samples if parse_mode(s.mode) is not None]


def _groups(samples: Sequence[tuple[str, TtftSample]]) -> list[tuple[str, str, list[TtftSample]]]:
    """(label, case, samples) in case order; a case's opening request starts a new group, and the
    latest group of each label and case replaces earlier ones (a lab run again in the same study)."""
    groups: dict[tuple[str, str], list[TtftSample]] = {}
    labels: dict[str, int] = {}
    for label, s in samples:
        parsed = parse_mode(s.mode)
        if parsed is None:
            continue
        case, request = parsed
        labels.setdefault(label, len(labels))
        if request in OPENING or (label, case) not in groups:
            groups[(label, case)] = []
        groups[(label, case)].append(s)
    order = sorted(groups, key=lambda k: (CASES.index(k[1]) if k[1] in CASES else len(CASES), labels[k[0]], k[1]))
    return [(label, case, groups[(label, case)]) for label, case in order]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f}"


def _verdict(req: LabRequest | None, s: TtftSample, cold_ttft_ns: int | None) -> str:
    if s.error is not None:
        return f"error: {s.error}"
    t = s.timings
    if t is None or t.cache_n is None or t.prompt_n is None:
        return "no cache_n/prompt_n in the server's timings"
    if req is None:
        return "not part of a complete lab run: nothing to compare with"
    got = (t.cache_n, t.prompt_n)
    miss = "" if got == req.expect else f" (predicted cache_n={req.expect[0]} prompt_n={req.expect[1]})"
    if req.request == "again":
        if got == (s.length - 1, 1):
            return "should be cold, but came from a hidden cache (cache_n = L-1)" + miss
        if t.cache_n == 0:
            return "cold: " + (req.note or "no hidden cache") + miss
        return f"partly from a hidden cache ({t.cache_n} of {s.length} tokens)" + miss
    if req.common_prefix is not None:
        cp = req.common_prefix
        if t.cache_n > cp:
            return f"reuse kept {t.cache_n - cp} tokens past the edit; {t.prompt_n} prefilled" + miss
        if t.cache_n == cp:
            return f"no reuse: all {t.prompt_n} tokens after the common prefix ({cp}) prefilled again" + miss
        return f"cache_n below the common prefix ({cp})" + miss
    declared = declared_state(req.case, req.request)
    if declared == "warm":
        if got != req.expect:
            return f"expected from the slot, got cache_n={t.cache_n} prompt_n={t.prompt_n}"
        speedup = (
            f": {cold_ttft_ns / s.first_token_ns:,.0f}x faster than cold" if cold_ttft_ns and s.first_token_ns else ""
        )
        return "from the slot (cache_n = L-1)" + speedup
    if got == req.expect:
        return "cold"
    return f"labelled cold but cache-assisted: cache_n={t.cache_n} prompt_n={t.prompt_n}"


def analyse(samples: Sequence[tuple[str, TtftSample]], state_bytes: Mapping[str, int] | None = None) -> LabAnalysis:
    """Table rows with verdicts, and the headline findings, from stored (label, sample) pairs and, per label,
    the prompt state's bytes per token (:data:`STATE_ARTIFACT`; unknown: the host cache is assumed to keep it)."""
    rows: list[LabRow] = []
    for label, case, group in _groups(samples):
        opening = group[0]
        parsed = parse_mode(opening.mode)
        plan: dict[tuple[str, str], LabRequest] = {}
        if parsed is not None and parsed[1] in OPENING and opening.length >= MIN_LENGTH:
            plan = plan_requests(opening.length, (state_bytes or {}).get(label))
        cold_ttft = opening.first_token_ns if opening.error is None else None
        for s in group:
            _, request = parse_mode(s.mode) or ("", "")
            req = plan.get((case, request))
            t = s.timings
            rows.append(
                LabRow(
                    label=label,
                    case=case,
                    request=request,
                    length=s.length,
                    ttft_ns=s.first_token_ns,
                    cache_n=t.cache_n if t else None,
                    prompt_n=t.prompt_n if t else None,
                    prompt_ms=t.prompt_ms if t else None,
                    gap_ns=(
                        s.first_token_ns - round(t.prompt_ms * 1e6)
                        if s.first_token_ns is not None and t is not None and t.prompt_ms is not None
                        else None
                    ),
                    expect=req.expect if req else None,
                    common_prefix=req.common_prefix if req else None,
                    verdict=_verdict(req, s, cold_ttft),
                )
            )
    return LabAnalysis(rows=tuple(rows), headlines=tuple(_headlines(rows)))


def complete_scenarios(samples: Sequence[tuple[str, TtftSample]], label: str, length: int) -> set[str]:
    """Scenarios of ``label``'s lab at ``length`` whose every planned request is stored without error."""
    done: set[str] = set()
    plan = plan_requests(length)
    for lab_label, case, group in _groups(lab_samples(samples)):
        if lab_label != label or group[0].length != length:
            continue
        got = {(case, (parse_mode(s.mode) or ("", ""))[1]) for s in group if s.error is None and s.timings is not None}
        if all(key in got for key in plan if key[0] == case):
            done.add(case)
    return done


def _median_gap_ms(rows: Sequence[LabRow]) -> float | None:
    gaps = [r.gap_ns / 1e6 for r in rows if r.gap_ns is not None and r.request.startswith("other-")]
    return summarize(gaps).median if gaps else None


def _headlines(rows: Sequence[LabRow]) -> list[str]:
    out: list[str] = []
    labels = list(dict.fromkeys(r.label for r in rows))
    for label in labels:
        mine = {(r.case, r.request): r for r in rows if r.label == label}
        first, again = mine.get(("resend", "first")), mine.get(("resend", "resend"))
        if first and again and first.ttft_ns and again.ttft_ns and first.ok and again.ok:
            out.append(
                f"{label}: resending a {first.length:,}-token prompt: TTFT {_ms(first.ttft_ns)} ms cold, "
                f"{_ms(again.ttft_ns)} ms from the slot ({first.ttft_ns / again.ttft_ns:,.0f}x), "
                f"cache_n {again.cache_n}, prompt_n {again.prompt_n}"
            )
        on, off = mine.get(("edit-move", "edited")), mine.get(("edit-move-noreuse", "edited"))
        if on and off and on.ttft_ns and off.ttft_ns:
            out.append(
                f"{label}: after dropping a chunk from the middle, --cache-reuse {REUSE_MIN} gave cache_n "
                f"{on.cache_n}, prompt_n {on.prompt_n} (TTFT {_ms(on.ttft_ns)} ms) vs cache_n {off.cache_n}, "
                f"prompt_n {off.prompt_n} without reuse (TTFT {_ms(off.ttft_ns)} ms)"
            )
        for case, what in (
            ("edit-insert", f"an edit of {INSERTED} tokens inserted mid-prompt"),
            ("edit-move-short", f"a kept chunk of {SHORT} tokens (under {REUSE_MIN})"),
        ):
            r = mine.get((case, "edited"))
            if r and r.common_prefix is not None and r.cache_n is not None:
                helped = (
                    "reused past the edit" if r.cache_n > r.common_prefix else "nothing reused past the common prefix"
                )
                out.append(
                    f"{label}: with --cache-reuse {REUSE_MIN}, {what}: {helped} "
                    f"(common prefix {r.common_prefix}, cache_n {r.cache_n}, prompt_n {r.prompt_n})"
                )
        hd, hc = mine.get(("hidden-defaults", "again")), mine.get(("hidden-cold", "again"))
        if hd and hd.cache_n is not None:
            control = (
                f", {hc.cache_n} with -np 1 --cache-ram 0"
                if hc and hc.cache_n is not None
                else " (the -np 1 --cache-ram 0 control was not measured)"
            )
            why = f": {hd.verdict}" if hd.cache_n == 0 and hd.ok else ""
            out.append(
                f"{label}: a prompt sent again after {OTHERS} others and an erase of every slot: cache_n "
                f"{hd.cache_n} of {hd.length:,} with default settings{control}{why}"
            )
        gd = _median_gap_ms([r for r in rows if r.label == label and r.case == "hidden-defaults"])
        gc = _median_gap_ms([r for r in rows if r.label == label and r.case == "hidden-cold"])
        if gd is not None:
            length = max(r.length for r in rows if r.label == label and r.request.startswith("other-"))
            control = (
                f" vs {gc:,.1f} ms with -np 1 --cache-ram 0"
                if gc is not None
                else " (the -np 1 --cache-ram 0 control was not measured)"
            )
            out.append(
                f"{label}: client TTFT - server prompt_ms after another {length:,}-token prompt: {gd:,.1f} ms "
                f"with default settings (the previous slot saved to host memory first){control} "
                f"(median of {OTHERS})"
            )
    return out
