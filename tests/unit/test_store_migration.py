"""Schema 3 of the results store: one configuration, one key. Tested on copies of the committed H200 stores as they
were before it (tests/fixtures/stores-v2, gzipped), and on the committed studies as they are now: every measurement
keeps its configuration, each configuration has one key derived from what it asks of llama.cpp, every committed
report rebuilds byte for byte, and a resumed study finds everything it measured (nothing is measured again)."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from xover.analysis.crossover import separation
from xover.analysis.theory import model_terms
from xover.domain.presets import preset
from xover.domain.shapes import tensor_table
from xover.domain.study_spec import load_spec
from xover.measure.resume import pending
from xover.results.read_model import cached_inputs, crossover_inputs, load
from xover.results.store import SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "stores-v2"
V2_STORES = sorted(FIXTURES.glob("*.sqlite.gz"))
_TABLES = ("bench_results", "ttft_samples", "failures", "session_turns")


def _unpack(gz: Path, into: Path) -> Path:
    into.mkdir(parents=True)
    (into / "results.sqlite").write_bytes(gzip.decompress(gz.read_bytes()))
    return into


def _counts_by_label(db: sqlite3.Connection) -> dict[str, Counter[str]]:
    """Rows of each measurement table per configuration label, through the store's own configs table."""
    labels = dict(db.execute("SELECT key, label FROM configs"))
    out: dict[str, Counter[str]] = {}
    for table in _TABLES:
        out[table] = Counter(labels.get(k, k) for (k,) in db.execute(f"SELECT config_key FROM {table}"))
    return out


@pytest.mark.parametrize("gz", V2_STORES, ids=lambda p: p.name.removesuffix(".sqlite.gz"))
def test_a_schema_2_store_keeps_every_measurement_under_one_key_per_configuration(gz: Path, tmp_path: Path) -> None:
    study = _unpack(gz, tmp_path / "st")
    with sqlite3.connect(study / "results.sqlite") as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
        before = _counts_by_label(db)
        kinds = Counter(kind for (kind,) in db.execute("SELECT kind FROM configs"))
        labels = {label for (label,) in db.execute("SELECT label FROM configs")}
    assert set(kinds) <= {"bench", "server"}
    with Store(study) as st:  # migrates
        configs = st.configs()
        after = _counts_by_label(st.db)
        version = st.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
        keys = {k for (k,) in st.db.execute("SELECT key FROM configs")}
        bodies = [body for _, _, body in st.artifacts()]
    assert int(version) == SCHEMA_VERSION == 3
    assert after == before  # every row kept, each under its configuration's label
    assert sorted(c.name for c in configs) == sorted(labels)  # one configuration (and key) per label
    assert {c.key for c in configs} == keys  # each key is the configuration's own identity
    referenced = {b["config_key"] for b in bodies if isinstance(b, dict) and "config_key" in b}
    assert referenced <= keys  # artifacts (memory, server props, llama-bench markdown...) moved with them
    signatures = [b["signature"] for b in bodies if isinstance(b, dict) and b.get("schema") == "xover.tune/1"]
    assert all(isinstance(s, str) and len(s) == 16 for s in signatures)
    with Store(study) as st:  # opening it again changes nothing
        assert _counts_by_label(st.db) == after and {c.key for c in st.configs()} == keys


def test_the_cache_lab_and_both_tools_measure_one_configuration(tmp_path: Path) -> None:
    """The committed qwen3-30b-a3b study ran its cache lab on ncmoe=0: six scenario servers with xover's own flags,
    llama-bench and the cold TTFT server were seven records under seven keys; they are one configuration now."""
    study = _unpack(FIXTURES / "h200-qwen3-30b-a3b.sqlite.gz", tmp_path / "st")
    with sqlite3.connect(study / "results.sqlite") as db:
        old = [k for k, label in db.execute("SELECT key, label FROM configs") if label == "ncmoe=0"]
    assert len(old) > 2
    data = load(study)
    (config,) = [c for c in data.configs if c.name == "ncmoe=0"]
    assert config.settings == (("n-cpu-moe", "0"), ("n-gpu-layers", "99"))
    modes = {s.mode for label, s in data.ttft if label == "ncmoe=0"}
    assert "cold" in modes and any(m.startswith("cache:") for m in modes)
    assert {label for label, r in data.bench} >= {"ncmoe=0"}


STUDIES = (
    ("h200-16gib-qwen3-30b-a3b", "study.toml", ()),
    ("h200-gpt-oss-120b-budgets/g24", "../study-24gib.toml", ()),
    ("h200-gpt-oss-120b-budgets/g32", "../study-32gib.toml", ()),
    # run in parts (run-tuned.sh named its configurations): ncmoe=18 -nopo was never tuned, as its README says
    ("h200-qwen3-30b-a3b", "study.toml", ("the tuning search of ncmoe=18 -nopo",)),
    # both engines' defaults failed to start there (xover's own CUDA context took 524 MiB of the budget): a resume
    # measures them; the next lease seeds from this store instead and measures all four afresh (run.sh)
    (
        "h200-engines/lease-2026-12-03c",
        "../study.toml",
        ("llama.cpp: 18 cold TTFT samples and cached turns", "ik_llama.cpp: 18 cold TTFT samples and cached turns"),
    ),
    # lease d measured rounds 1 and 2, lease e rounds 3 and 4 (4 where a pair was still open) and the drift check
    ("h200-engines", "study.toml", ()),
    # lease e's rerun: the same checks and tuning, rounds 1-3 measured afresh in a store of their own
    ("h200-engines/rerun-2026-12-03e", "../study.toml", ()),
    # lease 4 (an H100): the tuning and round 1, cut inside vk-cpu6 tuned's server; lease 5 (an H100) rounds 2-3, cut
    # inside vk-cpu6 tuned's third server: its round 3 is left, and each default configuration's 2K cached turns of
    # rounds 2-3 (stored as failed: a checkpoint restore re-processed one token, which the check now accepts); lease 6
    # (an H100, another boot) left rounds 2-3 as they were and measured rounds 4-8, so these stay unmeasured there
    (
        "h200-backends/gpt-oss-20b/on-h100",
        "../study.toml",
        tuple(
            f"{name}: {n} cold TTFT samples and cached turns"
            for name, n in (("cuda-gpu", 2), ("vk-gpu", 2), ("cuda-cpu6", 2), ("vk-cpu6", 2), ("vk-cpu6 tuned", 6))
        ),
    ),
)


@pytest.mark.parametrize(("study", "spec", "left"), STUDIES, ids=lambda v: v if isinstance(v, str) else "")
def test_a_committed_study_resumes_without_measuring_again(
    study: str, spec: str, left: tuple[str, ...], tmp_path: Path
) -> None:
    """What `xover study SPEC -o COPY` would measure on a copy elsewhere, by the stages' own plan
    (xover.measure.resume): the planner places each fit level, llama.cpp's stored check confirms it, the stored
    tuning of each unchanged configuration gives its tuned variant, and every llama-bench test and cold sample is
    found under its configuration's key."""
    copy = tmp_path / "moved"
    shutil.copytree(ROOT / "studies" / study, copy, ignore=shutil.ignore_patterns("logs", "*.png", "*.html"))
    the_spec = load_spec(ROOT / "studies" / study / spec)
    data = load(copy)
    (model_key,) = {r.provenance.model.key for r in data.runs if r.provenance.model is not None}
    assert the_spec.model_preset is not None
    terms = model_terms(tensor_table(preset(the_spec.model_preset)))
    todo = pending(the_spec, data, terms, model_key)
    assert tuple(todo.describe()) == (left or ("nothing to measure: every configuration's results are stored",))
    measured = {c.name for c in todo.configs}
    assert {label for label, _ in data.cold_samples()} <= measured


REPORTS = ("h200-16gib-qwen3-30b-a3b", "h200-gpt-oss-120b-budgets/g24", "h200-gpt-oss-120b-budgets/g32",
           "h200-qwen3-30b-a3b", "h200-smoke", "h200-engines", "h200-engines/rerun-2026-12-03e",
           "h200-backends/qwen3-30b-a3b/lease-2026-12-04", "h200-backends/qwen3-30b-a3b/lease-2026-12-04b",
           "h200-backends/qwen3-30b-a3b", "h200-backends/gpt-oss-20b/on-h100")  # fmt: skip


@pytest.mark.parametrize("study", REPORTS)
def test_every_committed_report_rebuilds_byte_for_byte(study: str, tmp_path: Path) -> None:
    from xover.report.html import build_report, render_markdown

    copy = tmp_path / Path(study).name  # the report is titled by its directory
    copy.mkdir()
    shutil.copy(ROOT / "studies" / study / "results.sqlite", copy / "results.sqlite")
    assert render_markdown(build_report(load(copy))) == (ROOT / "studies" / study / "report.md").read_text()


def test_the_committed_stores_are_of_this_schema() -> None:
    for path in sorted((ROOT / "studies").rglob("results.sqlite")):
        with sqlite3.connect(path) as db:
            version = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            kinds = {k for (k,) in db.execute("SELECT kind FROM configs")}
        assert version == (str(SCHEMA_VERSION),) and kinds <= {"llama"}, path


def calls(study: str) -> dict[tuple[str, str, str, int], int]:
    data = load(ROOT / "studies" / study)
    out = {}
    for kind, configs in (("cold", crossover_inputs(data)), ("cached", cached_inputs(data))):
        by = {c.label: c for c in configs}
        for a, b in combinations(sorted(by), 2):
            for n in sorted(set(by[a].ttft_s) & set(by[b].ttft_s)):
                out[(kind, a, b, n)] = separation(by[a], by[b], n, 200)
    return out


def test_the_engines_rerun_reverses_no_call() -> None:
    """The H200 engines study and its rerun in the same lease (rerun-2026-12-03e: the same checks and tuning, the
    rounds measured afresh in a store of its own) call every pair of configurations at every length, cold and on
    cached turns, by the same rule the report uses. A pair one store calls and the other calls the other way would
    be a winner a rerun reverses. The README's account: of 36 comparisons, 18 called alike, 15 indistinguishable in
    both, 3 called in one store only, none reversed."""
    first, rerun = calls("h200-engines"), calls("h200-engines/rerun-2026-12-03e")
    assert first.keys() == rerun.keys() and len(first) == 36
    assert not [k for k in first if first[k] * rerun[k] == -1]  # reversed
    assert sum(first[k] == rerun[k] != 0 for k in first) == 18
    assert sum(first[k] == rerun[k] == 0 for k in first) == 15
    one_sided = {k for k in first if first[k] != rerun[k]}
    assert one_sided == {
        ("cached", "ik_llama.cpp", "ik_llama.cpp tuned", 512),  # the rerun calls ik's defaults faster
        ("cold", "ik_llama.cpp", "llama.cpp tuned", 4096),  # the rerun calls mainline tuned faster
        ("cold", "llama.cpp", "llama.cpp tuned", 1024),  # the first store calls mainline tuned faster
    }
    # the headline calls, alike in both: ik's defaults beat mainline's at every length, the tuned pair is not parted
    for store in (first, rerun):
        assert all(store[("cold", "ik_llama.cpp", "llama.cpp", n)] == -1 for n in (1024, 4096, 16384, 32768))
        assert all(store[("cold", "ik_llama.cpp tuned", "llama.cpp tuned", n)] == 0 for n in (1024, 4096, 16384, 32768))


def test_the_backends_rerun_reverses_no_call() -> None:
    """Lease 3 of h200-backends measured qwen3-30b-a3b's rounds afresh on lease 2's tuning, with the longer Vulkan
    warm-up. Lease 2 (2 rounds of the tuned variants, 3 at the defaults) called 19 comparisons; lease 3 (3 rounds of
    all eight) calls those 19 the same way, reverses none, and calls 136 more that lease 2 could not part."""
    lease2, lease3 = calls("h200-backends/qwen3-30b-a3b/lease-2026-12-04b"), calls("h200-backends/qwen3-30b-a3b")
    assert lease2.keys() == lease3.keys() and len(lease2) == 168
    assert not [k for k in lease2 if lease2[k] * lease3[k] == -1]  # reversed
    assert sum(lease2[k] == lease3[k] != 0 for k in lease2) == 19
    assert not [k for k in lease2 if lease2[k] != 0 and lease3[k] == 0]  # called by lease 2 alone
    # the headline: CUDA beats Vulkan tuned, at every cold length and on every cached turn, with or without experts on
    # the CPU
    for a, b in (("cuda-gpu tuned", "vk-gpu tuned"), ("cuda-cpu12 tuned", "vk-cpu12 tuned")):
        assert all(lease3[("cold", a, b, n)] == -1 for n in (1024, 4096, 16384, 32768))
        assert all(lease3[("cached", a, b, n)] == -1 for n in (512, 2048))
