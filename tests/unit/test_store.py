"""The results store round-trips every record type and survives reopening."""

import dataclasses
import json
import sqlite3

import pytest

from fakes.records import provenance
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, Failure, ServerTimings, TtftSample
from xover.errors import XoverError
from xover.results.store import SCHEMA_VERSION, Store, iter_rows


def test_round_trip(tmp_path):
    cfg = LlamaConfig(
        "ncmoe=12", settings=(("n-cpu-moe", "12"), ("ubatch-size", "512"), ("GGML_OP_OFFLOAD_MIN_BATCH", "32"))
    )
    res = BenchResult(cfg.key, 512, 0, 4000, (1_000_000, 1_100_000), (512.0, 465.45), 488.7, 33.2, {"avg_ts": 488.7})
    scfg = LlamaConfig("ncmoe=12 jinja", settings=(("n-cpu-moe", "12"),), server_args=("--jinja",))
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
        run = st.begin_run("bench", ["xover", "bench"], provenance())
        st.put_config(cfg)
        st.put_config(scfg)
        st.put_config(cfg)  # measured by llama-server too: the same configuration, the same record
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
        assert st.configs() == [cfg, scfg]
        assert st.failures()[0][1].stderr_tail == "oom"
        assert st.artifacts("server-props")[0][2] == {"n_ctx": 4096}
        (r,) = st.runs()
        assert r["status"] == "done" and r["provenance"] == provenance()
        assert st.integrity_ok()
        assert [row["test"] for row in iter_rows(st, "bench_results")] == ["pp512 @ d4000"]
        with pytest.raises(ValueError):
            list(iter_rows(st, "sqlite_master"))
        st.put_config(dataclasses.replace(cfg, name="renamed"))  # stored again under another name: its latest
        assert [(c.key, c.name) for c in st.configs()] == [(cfg.key, "renamed"), (scfg.key, scfg.name)]


def test_config_key_is_content_addressed():
    a = LlamaConfig("a", settings=(("n-cpu-moe", "12"), ("ubatch-size", "512")))
    b = LlamaConfig("renamed", settings=(("ubatch-size", "512"), ("n-cpu-moe", "12")))  # in another order
    c = LlamaConfig("a", settings=(("n-cpu-moe", "18"), ("ubatch-size", "512")))
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
        run = st.begin_run("bench", ["x"], provenance())
        (r,) = st.runs()
        assert r["id"] == run and r["started_unix_ns"] > 0
        assert st.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_v2_store_is_migrated_to_one_key_per_configuration(tmp_path):
    """Before schema 3 a configuration measured by llama-bench and llama-server was stored twice, under a key of
    llama-bench's flags and one of llama-server's whole argument list (with xover's own flags in it): opening
    the store re-keys both, and every measurement, to the configuration's one key."""
    with Store(tmp_path) as st:
        run = st.begin_run("study", ["xover"], provenance())
        rows = [
            ("bench-key", "bench", "ncmoe=12", {"label": "ncmoe=12", "fields": [["-ncmoe", "12"]], "env": []}),
            ("server-key", "server", "ncmoe=12", {"label": "ncmoe=12", "args": ["-m", "/x/m.gguf", "-c", "4096",
             "-ngl", "99", "--n-cpu-moe", "12", "-np", "1", "--cache-ram", "0", "-fit", "off"], "env": []}),
        ]  # fmt: skip
        for key, kind, label, spec in rows:
            st.db.execute(
                "INSERT INTO configs(key, kind, label, spec) VALUES(?,?,?,?)", (key, kind, label, json.dumps(spec))
            )
        res = BenchResult("bench-key", 512, 0, 0, (1_000_000,), (512.0,), 512.0, 0.0, {})
        st.add_bench_result(run, "mk", res)
        st.add_ttft_sample(run, "mk", TtftSample("server-key", "cold", 1024, 0, "p", 1, 1, 2, 3, (2,), 1, None, True))
        st.add_failure(run, Failure("server-key", "server-start", "-", "no port", ""))
        st.db.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
    want = LlamaConfig("ncmoe=12", settings=(("n-cpu-moe", "12"),))
    with Store(tmp_path) as st:
        assert st.configs() == [want]
        assert [r.config_key for _, _, _, r in st.bench_results()] == [want.key]
        assert [s.config_key for _, _, _, s in st.ttft_samples()] == [want.key]
        assert [f.config_key for _, f in st.failures()] == [want.key]
        assert st.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert st.integrity_ok()


def test_raw_server_samples_export_as_csv_and_jsonl(tmp_path):
    import csv
    import io
    import json

    from xover.report import export

    scfg = LlamaConfig("ncmoe=<18>", settings=(("n-cpu-moe", "18"),))
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
        run = st.begin_run("ttft", ["xover", "ttft"], provenance())
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
