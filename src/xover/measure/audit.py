"""`xover audit`: re-check every stored TTFT sample against its own cache_n/prompt_n.

A sample's ``cache_ok`` flag was set when it was measured; the audit trusts only the numbers. A
sample that claims a cache state is checked the way it was measured (:func:`xover.measure.ttft.check_cache`):
cold (``cache_n == 0`` and ``prompt_n == length``) or warm (``cache_n == length - 1`` and
``prompt_n == 1``). Lab requests (``cache:<case>:<request>``) claim what
:func:`xover.measure.cachelab.declared_state` says; lab demonstrations that claim nothing (an edited prompt,
a resend on default settings) are counted, not checked. Samples that ended in an error were never
averaged and are not checked.

A finding is a sample whose numbers contradict its claim: a measurement labelled cold that was
cache-assisted. ``counted`` findings are the dangerous ones: the stored flag says the check passed
(an older xover, an edited or merged store), so every summary built from the flag includes them.
The corrected summary shows the median TTFT per configuration, mode and length with and without
the findings. :func:`audit` is pure; :func:`load_samples` reads the samples through the read model
(:mod:`xover.results.read_model`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from xover.analysis.stats import Summary, summarize_present
from xover.domain.records import TTFT_MODES
from xover.measure.cachelab import declared_state, parse_mode
from xover.measure.ttft import check_cache
from xover.results.read_model import StoredSample, load

MEASURED_MODES = TTFT_MODES


@dataclasses.dataclass(frozen=True)
class Finding:
    """A stored sample whose cache_n/prompt_n contradict the cache state it claims."""

    stored: StoredSample
    claim: str  # "cold" or "warm"
    reason: str

    @property
    def counted(self) -> bool:
        """Its stored cache_ok flag says it passed, so summaries include it."""
        return self.stored.sample.cache_ok


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """Median TTFT of one configuration, mode and length: as stored vs without the findings."""

    label: str
    mode: str
    length: int
    stored: Summary | None  # TTFT (ns) of the samples the store counts (cache_ok, no error)
    corrected: Summary | None  # the same without the findings
    n_removed: int

    @property
    def changed(self) -> bool:
        return self.n_removed > 0


@dataclasses.dataclass(frozen=True)
class AuditResult:
    n_samples: int
    n_checked: int  # samples that claim cold or warm and finished without error
    n_unclaimed: int  # lab demonstrations: nothing to check
    findings: tuple[Finding, ...]
    summary: tuple[SummaryRow, ...]

    @property
    def n_counted(self) -> int:
        return sum(1 for f in self.findings if f.counted)


def claim(mode: str) -> str | None:
    """The cache state a stored mode claims: ``cold``, ``warm`` or None (a lab demonstration)."""
    if mode in MEASURED_MODES:
        return mode
    parsed = parse_mode(mode)
    return declared_state(*parsed) if parsed is not None else None


def audit(samples: Sequence[StoredSample]) -> AuditResult:
    findings: list[Finding] = []
    flagged: set[int] = set()
    n_checked = n_unclaimed = 0
    for st in samples:
        s = st.sample
        state = claim(s.mode)
        if state is None:
            n_unclaimed += 1
            continue
        if s.error is not None:
            continue
        n_checked += 1
        reason = check_cache(state, s.length, s.timings)
        if reason is None:
            continue
        flagged.add(st.row_id)
        findings.append(Finding(st, state, reason))
    return AuditResult(len(samples), n_checked, n_unclaimed, tuple(findings), tuple(_summary(samples, flagged)))


def _summary(samples: Sequence[StoredSample], flagged: set[int]) -> list[SummaryRow]:
    groups: dict[tuple[str, str, int], list[StoredSample]] = {}
    for st in samples:
        if st.sample.mode in MEASURED_MODES:
            groups.setdefault((st.label, st.sample.mode, st.sample.length), []).append(st)
    rows = []
    for point, group in sorted(groups.items()):  # (label, mode, length): the row's first fields
        counted = [st for st in group if st.sample.counted]
        kept = [st for st in counted if st.row_id not in flagged]
        rows.append(
            SummaryRow(*point, stored=_ttft(counted), corrected=_ttft(kept), n_removed=len(counted) - len(kept))
        )
    return rows


def _ttft(group: Sequence[StoredSample]) -> Summary | None:
    return summarize_present([st.sample.first_token_ns for st in group])


def load_samples(study_dir: Path) -> list[StoredSample]:
    """Every TTFT sample of a study directory's store, oldest first, with its configuration's label."""
    return list(load(study_dir, written_by="xover ttft, cache or study").ttft_rows)
