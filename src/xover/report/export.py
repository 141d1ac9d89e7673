"""Export a study's llama-bench results as markdown, CSV or JSONL, re-rendered from the store alone;
and its raw llama-server samples (cold/warm/cache-lab TTFT samples, agentic session turns) as CSV or JSONL.

:func:`xover.results.read_model.load` reads the store; the ``render_*`` functions are pure (data in, text
out); :func:`write` is the one place that writes an export file.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from xover.domain import llama_options
from xover.domain.config import LlamaConfig
from xover.errors import XoverError
from xover.report.tables import render_bench_table, short_labels
from xover.results.read_model import BenchData, StoredFailure, StudyData, bench_data, load

FORMATS = ("md", "csv", "jsonl")

# Settings llama-bench reports in every record (the option table's record fields: the values it actually used,
# defaults included), then the build and the test's time.
_RECORD_COLUMNS = (*llama_options.record_fields(), "build_commit", "build_number", "backends", "test_time")


# ---- renderers (pure) -----------------------------------------------------------------------------


def standing_failures(data: BenchData) -> list[StoredFailure]:
    """Failures no later run repaired: a configuration that failed in run k and was measured with the
    same model by a run after k counts as repaired."""
    last_measured: dict[tuple[str, str], int] = {}
    for s in data.results:
        key = (s.result.config_key, s.model_key)
        last_measured[key] = max(last_measured.get(key, 0), s.run_id)
    return [f for f in data.failures if f.run_id >= last_measured.get((f.failure.config_key, f.model_key or ""), 0)]


def render_markdown(data: BenchData) -> str:
    """One table per model, columns for the configurations measured (or failed) with it."""
    models = list(
        dict.fromkeys([s.model_key for s in data.results] + [f.model_key for f in data.failures if f.model_key])
    )
    tables = []
    for model in models:
        results = [s.result for s in data.results if s.model_key == model]
        failures = [f.failure for f in standing_failures(data) if f.model_key == model]
        used = {r.config_key for r in results} | {f.config_key for f in failures}
        configs = [c for c in data.configs if c.key in used]
        tables.append(render_bench_table(configs, results, failures, data.model_names.get(model)))
    return "\n".join(tables) if tables else "(no llama-bench results in this study)\n"


def _config_dict(config: LlamaConfig | None, label: str) -> dict[str, Any]:
    if config is None:
        return {"label": label}
    return {
        "key": config.key,
        "label": label,
        "engine": config.engine,
        "settings": dict(config.settings),
        "llama_bench_args": list(config.bench_argv()),
        "env": [list(e) for e in config.environment()],
    }


def _labels(data: BenchData) -> dict[str, str]:
    return dict(zip((c.key for c in data.configs), short_labels(data.configs)))


def render_jsonl(data: BenchData) -> str:
    """One object per stored test (``"type": "bench_result"``, raw samples and llama-bench's record)
    and per failure (``"type": "failure"``)."""
    configs = {c.key: c for c in data.configs}
    labels = _labels(data)
    lines = []
    for s in data.results:
        r = s.result
        lines.append(
            {
                "type": "bench_result",
                "run_id": s.run_id,
                "model_key": s.model_key,
                "model": data.model_names.get(s.model_key),
                "config": _config_dict(configs.get(r.config_key), labels.get(r.config_key, r.config_key)),
                "test": r.test_name,
                "n_prompt": r.n_prompt,
                "n_gen": r.n_gen,
                "n_depth": r.n_depth,
                "avg_ts": r.avg_ts,
                "stddev_ts": r.stddev_ts,
                "samples_ns": list(r.samples_ns),
                "samples_ts": list(r.samples_ts),
                "record": r.record,
            }
        )
    for f in data.failures:
        lines.append(
            {
                "type": "failure",
                "run_id": f.run_id,
                "model_key": f.model_key,
                "config": _config_dict(
                    configs.get(f.failure.config_key), labels.get(f.failure.config_key, f.failure.config_key)
                ),
                "stage": f.failure.stage,
                "point": f.failure.point,
                "reason": f.failure.reason,
                "stderr_tail": f.failure.stderr_tail,
            }
        )
    return "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)


def render_csv(data: BenchData) -> str:
    """One row per stored test; samples space-separated; the settings llama-bench reports as columns."""
    labels = _labels(data)
    columns = [
        "run_id",
        "model",
        "model_key",
        "config",
        "config_key",
        "test",
        "n_prompt",
        "n_gen",
        "n_depth",
        "repetitions",
        "avg_ts",
        "stddev_ts",
        *_RECORD_COLUMNS,
        "samples_ts",
        "samples_ns",
    ]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for s in data.results:
        r = s.result
        row: dict[str, Any] = {
            "run_id": s.run_id,
            "model": data.model_names.get(s.model_key, ""),
            "model_key": s.model_key,
            "config": labels.get(r.config_key, ""),
            "config_key": r.config_key,
            "test": r.test_name,
            "n_prompt": r.n_prompt,
            "n_gen": r.n_gen,
            "n_depth": r.n_depth,
            "repetitions": len(r.samples_ns),
            "avg_ts": r.avg_ts,
            "stddev_ts": r.stddev_ts,
            "samples_ts": " ".join(repr(x) for x in r.samples_ts),
            "samples_ns": " ".join(str(x) for x in r.samples_ns),
        }
        row.update({k: r.record.get(k, "") for k in _RECORD_COLUMNS})
        writer.writerow(row)
    return buf.getvalue()


RENDERERS = {"md": render_markdown, "csv": render_csv, "jsonl": render_jsonl}

KINDS = ("bench", "ttft", "session")


def sample_rows(study: StudyData | Path, kind: str) -> list[dict[str, Any]]:
    """Every stored TTFT sample (``kind="ttft"``) or session turn (``"session"``) of a study (its read model
    or its directory) as a flat dict: the record's own fields (server timings as ``timings.<name>``), its run,
    model key and configuration label."""
    data = study if isinstance(study, StudyData) else load(study)
    rows: list[tuple[int, str, Any]] = (
        [(s.run_id, s.model_key, s.sample) for s in data.ttft_rows]
        if kind == "ttft"
        else [(t.run_id, t.model_key, t.turn) for t in data.turn_rows]
    )
    out = []
    for run_id, model_key, rec in rows:
        d: dict[str, Any] = {"run_id": run_id, "model_key": model_key, "config": data.labels.get(rec.config_key, "")}
        for key, value in dataclasses.asdict(rec).items():
            if isinstance(value, dict):  # nested records (ServerTimings)
                d.update({f"{key}.{k}": v for k, v in value.items()})
            elif isinstance(value, (tuple, list)):
                d[key] = " ".join(str(x) for x in value)
            else:
                d[key] = value
        out.append(d)
    return out


def _raw_formats_only(kind: str, fmt: str) -> None:
    if fmt == "md":
        raise XoverError(f"--what {kind} exports raw samples: use -f csv or -f jsonl (md is llama-bench's table)")


def render_samples(data: StudyData, kind: str, fmt: str) -> str:
    """Raw llama-server samples as CSV (a header from every field seen) or JSONL (one object each)."""
    _raw_formats_only(kind, fmt)
    rows = sample_rows(data, kind)
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def render(data: BenchData, fmt: str) -> str:
    if fmt not in RENDERERS:
        raise XoverError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    return RENDERERS[fmt](data)


def render_kind(study_dir: Path, kind: str, fmt: str) -> str:
    if kind not in KINDS:
        raise XoverError(f"unknown export {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "bench":
        return render(bench_data(load(study_dir)), fmt)
    _raw_formats_only(kind, fmt)  # before reading: a wrong format is named even where there is no store
    return render_samples(load(study_dir), kind, fmt)


def write(study_dir: Path, fmt: str, dest: Path | None = None, kind: str = "bench") -> Path:
    """Render a study and write it to ``dest`` (default ``STUDY_DIR/<kind>.<fmt>``); return the path."""
    text = render_kind(study_dir, kind, fmt)
    path = dest or study_dir / f"{kind}.{fmt}"
    try:
        path.write_text(text)
    except OSError as e:
        raise XoverError(f"cannot write {path} ({e.strerror}): pick another --output") from None
    return path
