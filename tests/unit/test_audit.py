"""The audit trusts numbers, not flags: constructed samples with known answers, and the CLI on a written store."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.records import provenance
from xover.cli import main
from xover.domain.config import LlamaConfig
from xover.domain.records import ServerTimings, TtftSample
from xover.errors import XoverError
from xover.measure.audit import StoredSample, audit, claim, load_samples
from xover.results.store import Store


def _sample(
    mode: str,
    length: int,
    cache_n: int | None,
    prompt_n: int | None,
    ttft_ms: float,
    cache_ok: bool = True,
    error: str | None = None,
    config_key: str = "k",
) -> TtftSample:
    ttft = round(ttft_ms * 1e6)
    timings = ServerTimings(cache_n, prompt_n, ttft_ms - 1, None, 8, 1.0, None) if cache_n is not None else None
    return TtftSample(
        config_key=config_key,
        mode=mode,
        length=length,
        rep=0,
        prompt_id="p",
        sent_at_unix_ns=0,
        first_byte_ns=ttft,
        first_token_ns=ttft,
        end_ns=ttft + 1,
        token_times_ns=(ttft,),
        n_tokens_received=1,
        timings=timings,
        cache_ok=cache_ok,
        error=error,
    )


def _stored(*samples: TtftSample, label: str = "A") -> list[StoredSample]:
    return [StoredSample(row_id=i + 1, run_id=1, label=label, sample=s) for i, s in enumerate(samples)]


def test_claims() -> None:
    assert claim("cold") == "cold" and claim("warm") == "warm"
    assert claim("cache:resend:first") == "cold" and claim("cache:resend:resend") == "warm"
    assert claim("cache:hidden-defaults:again") is None and claim("cache:edit-move:edited") is None
    assert claim("something-else") is None


def test_clean_samples_give_no_findings() -> None:
    r = audit(
        _stored(
            _sample("cold", 1000, 0, 1000, 100.0),
            _sample("warm", 1000, 999, 1, 5.0),
            _sample("cache:edit-move:edited", 608, 544, 64, 9.0),
        )
    )
    assert r.findings == () and (r.n_samples, r.n_checked, r.n_unclaimed) == (3, 2, 1)
    assert [(row.mode, row.stored.median, row.changed) for row in r.summary] == [  # type: ignore[union-attr]
        ("cold", 100e6, False),
        ("warm", 5e6, False),
    ]


def test_a_cache_hit_in_disguise_is_found_and_the_summary_corrected() -> None:
    samples = _stored(
        _sample("cold", 1000, 0, 1000, 100.0),
        _sample("cold", 1000, 0, 1000, 110.0),
        _sample("cold", 1000, 999, 1, 5.0, cache_ok=True),  # flagged OK, numbers say warm
        _sample("cold", 1000, 400, 600, 60.0, cache_ok=False),  # failed at measurement, never averaged
        _sample("cold", 1000, 999, 1, 5.0, cache_ok=False, error="stream broke"),  # errors are not checked
        _sample("warm", 1000, 0, 1000, 100.0, cache_ok=True),  # a warm sample that was cold
        _sample("cache:resend:first", 1024, 1023, 1, 4.0, cache_ok=True),
    )
    r = audit(samples)
    assert [(f.stored.row_id, f.claim, f.counted) for f in r.findings] == [
        (3, "cold", True),
        (4, "cold", False),
        (6, "warm", True),
        (7, "cold", True),
    ]
    assert r.n_counted == 3
    assert r.findings[0].reason == "cold check failed: cache_n=999 prompt_n=1, expected cache_n=0 prompt_n=1000"
    cold = next(row for row in r.summary if row.mode == "cold")
    assert cold.stored is not None and cold.corrected is not None
    assert (cold.stored.n, cold.stored.median) == (3, 100e6)  # 5, 100, 110 as the store counts them
    assert (cold.corrected.n, cold.corrected.median) == (2, 105e6) and cold.n_removed == 1
    warm = next(row for row in r.summary if row.mode == "warm")
    assert warm.corrected is None and warm.n_removed == 1


def test_a_sample_without_server_timings_cannot_prove_its_claim() -> None:
    (f,) = audit(_stored(_sample("cold", 1000, None, None, 100.0))).findings
    assert f.counted and f.reason == "no cache_n/prompt_n in the server's timings"


def test_a_directory_without_a_store_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(XoverError, match="holds no results.sqlite") as e:
        load_samples(tmp_path / "nothing")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "nothing").exists()  # the audit never creates a store


def _write(study: Path, polluted: bool) -> None:
    with Store(study) as st:
        run = st.begin_run("ttft", ["xover", "ttft"], provenance())
        cfg = LlamaConfig(name="ncmoe=18", settings=(("n-cpu-moe", "18"),))
        st.put_config(cfg)
        for ms in (100.0, 120.0):
            st.add_ttft_sample(run, "mk", _sample("cold", 4096, 0, 4096, ms, config_key=cfg.key))
        if polluted:  # a cache hit stored as a passing cold sample
            st.add_ttft_sample(run, "mk", _sample("cold", 4096, 4095, 1, 6.0, cache_ok=True, config_key=cfg.key))
        st.end_run(run, "done")


def test_cli_exit_status_follows_the_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "clean", polluted=False)
    main(["audit", str(tmp_path / "clean")])  # returns normally: exit 0
    assert "no sample contradicts its label" in capsys.readouterr().out
    _write(tmp_path / "polluted", polluted=True)
    with pytest.raises(SystemExit) as e:
        main(["audit", str(tmp_path / "polluted")])
    assert e.value.code == 1
    captured = capsys.readouterr()
    assert "ok (counted)" in captured.out and "cache_n=4095" in captured.out and "ncmoe=18" in captured.out
    assert "1 sample(s) labelled cold or warm were cache-assisted, 1 of them counted as passing" in captured.err
    with pytest.raises(SystemExit) as e:
        main(["audit", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("xover: error:") and err.count("\n") == 1
