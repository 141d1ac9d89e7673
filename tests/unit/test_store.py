"""The results store round-trips every record type and survives reopening."""

import sqlite3

import pytest

from xover.domain.records import (
    BenchConfig,
    BenchResult,
    Failure,
    ModelId,
    Provenance,
    ServerConfig,
    ServerTimings,
    TtftSample,
)
from xover.errors import XoverError
from xover.results.store import SCHEMA_VERSION, Store, iter_rows


def _prov() -> Provenance:
    return Provenance(
        llama_build_commit="0c1e570",
        llama_build_number=0,
        llama_backend="CPU",
        llama_bin_dir="/x",
        llama_bin_source="cache",
        cpu_info="cpu",
        gpu_info=None,
        hostname="h",
        os="Linux",
        xover_version="0.1.0",
        model=ModelId(path="/m.gguf", name="m.gguf", size_bytes=10, header_sha256="ab" * 32),
    )


def test_round_trip(tmp_path):
    cfg = BenchConfig(
        label="ncmoe=12", fields=(("-ncmoe", "12"), ("-ub", "512")), env=(("GGML_OP_OFFLOAD_MIN_BATCH", "32"),)
    )
    res = BenchResult(cfg.key, 512, 0, 4000, (1_000_000, 1_100_000), (512.0, 465.45), 488.7, 33.2, {"avg_ts": 488.7})
    scfg = ServerConfig(label="ncmoe=12", args=("--n-cpu-moe", "12", "-np", "1"))
    t = ServerTimings(
        cache_n=0,
        prompt_n=1024,
        prompt_ms=50.5,
        prompt_per_second=20277.0,
        predicted_n=16,
        predicted_ms=8.0,
        predicted_per_second=2000.0,
    )
    sample = TtftSample(
        scfg.key, "cold", 1024, 0, "p0", 1, 100, 51_000_000, 60_000_000, (51_000_000, 51_500_000), 16, t, True
    )
    with Store(tmp_path) as st:
        run = st.begin_run("bench", ["xover", "bench"], _prov())
        st.put_config(cfg)
        st.put_config(scfg)
        st.add_bench_result(run, "mk", res)
        st.add_ttft_sample(run, "mk", sample)
        st.add_failure(run, Failure(cfg.key, "bench", "pp512 @ d4000", "exit 1", "oom"))
        st.add_artifact(run, "server-props", {"n_ctx": 4096})
        st.end_run(run, "done")
    with Store(tmp_path) as st:  # reopen: everything is still there
        assert st.bench_results()[0][3] == res
        assert st.has_bench_point(cfg.key, "mk", 512, 0, 4000)
        assert not st.has_bench_point(cfg.key, "other-model", 512, 0, 4000)
        assert st.ttft_samples()[0][3] == sample
        assert st.configs("bench") == [cfg] and st.configs("server") == [scfg]
        assert st.failures()[0][1].stderr_tail == "oom"
        assert st.artifacts("server-props")[0][2] == {"n_ctx": 4096}
        (r,) = st.runs()
        assert r["status"] == "done" and r["provenance"] == _prov()
        assert st.integrity_ok()
        assert [row["test"] for row in iter_rows(st, "bench_results")] == ["pp512 @ d4000"]
        with pytest.raises(ValueError):
            list(iter_rows(st, "sqlite_master"))


def test_config_key_is_content_addressed():
    a = BenchConfig(label="a", fields=(("-ncmoe", "12"),))
    b = BenchConfig(label="renamed", fields=(("-ncmoe", "12"),))
    c = BenchConfig(label="a", fields=(("-ncmoe", "18"),))
    assert a.key == b.key != c.key


def test_test_names_follow_llama_bench():
    mk = lambda p, n, d: BenchResult("k", p, n, d, (), (), 0.0, 0.0, {}).test_name  # noqa: E731
    assert mk(512, 0, 0) == "pp512"
    assert mk(0, 128, 4000) == "tg128 @ d4000"
    assert mk(512, 128, 0) == "pp512+tg128"


def test_newer_schema_is_refused(tmp_path):
    Store(tmp_path).close()
    db = sqlite3.connect(tmp_path / "results.sqlite")
    db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(XoverError, match="upgrade xover"):
        Store(tmp_path)


def test_garbage_file_is_one_line_error(tmp_path):
    (tmp_path / "results.sqlite").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(XoverError, match="not a usable results store"):
        Store(tmp_path)


def test_v1_store_is_migrated(tmp_path):
    db = sqlite3.connect(tmp_path / "results.sqlite")
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "INSERT INTO meta VALUES('schema_version', '1');"
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, command TEXT NOT NULL, started_at TEXT NOT NULL,"
        " finished_at TEXT, status TEXT NOT NULL DEFAULT 'running', provenance TEXT NOT NULL);"
    )
    db.close()
    with Store(tmp_path) as st:
        run = st.begin_run("bench", ["x"], _prov())
        (r,) = st.runs()
        assert r["id"] == run and r["started_unix_ns"] > 0
        assert st.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_raw_server_samples_export_as_csv_and_jsonl(tmp_path):
    import csv
    import io
    import json

    from xover.report import export

    scfg = ServerConfig(label="ncmoe=<18>", args=("--n-cpu-moe", "18"))
    t = ServerTimings(
        cache_n=0,
        prompt_n=1024,
        prompt_ms=50.5,
        prompt_per_second=20277.0,
        predicted_n=16,
        predicted_ms=8.0,
        predicted_per_second=2000.0,
    )
    samples = [
        TtftSample(
            scfg.key,
            "cold",
            1024,
            rep,
            f"p{rep}",
            1,
            100,
            51_000_000 + rep,
            60_000_000,
            (51_000_000, 51_500_000),
            16,
            t,
            True,
        )
        for rep in range(2)
    ]
    with Store(tmp_path) as st:
        run = st.begin_run("ttft", ["xover", "ttft"], _prov())
        st.put_config(scfg)
        for s in samples:
            st.add_ttft_sample(run, "mk", s)
        st.end_run(run, "done")
    rows = list(csv.DictReader(io.StringIO(export.render_kind(tmp_path, "ttft", "csv"))))
    assert [r["first_token_ns"] for r in rows] == ["51000000", "51000001"]
    assert rows[0]["config"] == "ncmoe=<18>" and rows[0]["timings.cache_n"] == "0" and rows[0]["cache_ok"] == "True"
    assert rows[0]["token_times_ns"] == "51000000 51500000" and rows[0]["run_id"] == str(run)
    objs = [json.loads(line) for line in export.render_kind(tmp_path, "ttft", "jsonl").splitlines()]
    assert objs[1]["rep"] == 1 and objs[1]["timings.prompt_n"] == 1024
    assert export.render_kind(tmp_path, "session", "csv") == "\n"  # a header of no columns: nothing replayed
    with pytest.raises(XoverError, match="use -f csv or -f jsonl"):
        export.render_kind(tmp_path, "ttft", "md")
    assert export.write(tmp_path, "csv", kind="ttft") == tmp_path / "ttft.csv"


def test_sample_export_of_a_directory_without_a_store_fails_and_creates_nothing(tmp_path):
    from xover.report import export

    with pytest.raises(XoverError, match="holds no results.sqlite"):
        export.render_kind(tmp_path, "ttft", "csv")
    assert list(tmp_path.iterdir()) == []
