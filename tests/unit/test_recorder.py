"""One run per engine (xover.measure.recorder): a runner whose configurations run on mainline and ik_llama.cpp stores
each engine's numbers under a run whose provenance names that engine's binaries. Known answers on a real store, with
two folders of stand-in executables as the engines' builds (nothing is run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xover.domain.config import LlamaConfig
from xover.domain.records import Failure
from xover.llamacpp.binaries import Binaries, resolve
from xover.measure.recorder import Recording
from xover.results.store import Store

IK = "ik_llama.cpp"


def _build(d: Path) -> Path:
    d.mkdir(parents=True)
    for name in ("llama-bench", "llama-server"):
        (d / name).write_text("#!/bin/sh\n")
        (d / name).chmod(0o755)
    return d.resolve()


def _binaries(tmp_path: Path, ik: Path | None) -> Binaries:
    main = resolve(_build(tmp_path / "main" / "bin"))
    return dataclasses.replace(main, chosen=((IK, ik),) if ik is not None else ())


def _statuses(store: Store) -> dict[int, str]:
    return {r["id"]: r["status"] for r in store.runs()}


def test_each_engine_gets_its_own_run_naming_its_build(tmp_path: Path) -> None:
    ik_dir = _build(tmp_path / "ik" / "bin")
    binaries = _binaries(tmp_path, ik_dir)
    mainline, ik = LlamaConfig("m", (("threads", "1"),)), LlamaConfig("k", (("threads", "1"),), engine=IK)
    with Store(tmp_path / "st") as store:
        with Recording(store, "ttft", ["xover"], binaries=binaries, model=None) as rec:
            ik_run = rec.server_props(ik, {"build_info": "b0-ik"}, {})
            main_run = rec.ensure(build=("llama.cpp", None))
            rec.fail(mainline, Failure(mainline.key, "ttft", "L=1024", "out of memory"))
            assert (
                rec.ensure(build=(IK, None)) == ik_run and rec.ensure() == ik_run == rec.run_id
            )  # the first run begun
        ik_prov, main_prov = store.provenance(ik_run), store.provenance(main_run)
        assert (ik_prov.llama_engine, ik_prov.llama_bin_dir) == (IK, str(ik_dir))
        assert (main_prov.llama_engine, main_prov.llama_bin_dir) == ("llama.cpp", str(tmp_path.resolve() / "main/bin"))
        # a failure ends its own engine's run failed, and only that one
        assert _statuses(store) == {ik_run: "done", main_run: "failed"}
        assert [run for run, _ in store.failures()] == [main_run]


def test_one_engine_is_one_run_as_before(tmp_path: Path) -> None:
    binaries = _binaries(tmp_path, None)
    config = LlamaConfig("m", (("threads", "1"),))
    with Store(tmp_path / "st") as store:
        with Recording(store, "bench", ["xover"], binaries=binaries, model=None) as rec:
            first = rec.ensure({"build_commit": "0c1e570", "build_number": 1}, build=("llama.cpp", None))
            rec.artifact("memory", {"config_key": config.key}, build=config.build)
            rec.fail(config, Failure(config.key, "bench", "pp512", "exit 1"))
        assert _statuses(store) == {first: "failed"}
        prov = store.provenance(first)
        assert (prov.llama_build_commit, prov.llama_engine) == ("0c1e570", "llama.cpp")


def test_an_engine_without_a_build_still_stores_its_failure(tmp_path: Path) -> None:
    """Its build cannot be found (the folder given is gone): the failure is stored under a run of that engine with
    no build folder, instead of the error escaping the runner."""
    binaries = _binaries(tmp_path, tmp_path / "gone")
    ik = LlamaConfig("k", (("threads", "1"),), engine=IK)
    with Store(tmp_path / "st") as store:
        with Recording(store, "ttft", ["xover"], binaries=binaries, model=None) as rec:
            rec.fail(ik, Failure(ik.key, "server-start", "llama-server start", "no ik_llama.cpp build"))
        (run,) = _statuses(store)
        prov = store.provenance(run)
        assert (prov.llama_engine, prov.llama_bin_dir) == (IK, None)


def test_a_server_at_a_url_names_no_engine(tmp_path: Path) -> None:
    """xover did not start it: which engine it runs is not known here."""
    with Store(tmp_path / "st") as store:
        with Recording(store, "ttft", ["xover"], binaries=None, model=None) as rec:
            run = rec.server_props(LlamaConfig("http://h:8080", url="http://h:8080"), {"model_path": "/m.gguf"}, {})
        assert store.provenance(run).llama_engine is None and rec.model_key == "m.gguf:server"


def test_an_exception_ends_every_engine_run_interrupted(tmp_path: Path) -> None:
    binaries = _binaries(tmp_path, _build(tmp_path / "ik" / "bin"))
    with Store(tmp_path / "st") as store:
        try:
            with Recording(store, "ttft", ["xover"], binaries=binaries, model=None) as rec:
                runs = {rec.ensure(build=("llama.cpp", None)), rec.ensure(build=(IK, None))}
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        assert len(runs) == 2 and _statuses(store) == dict.fromkeys(runs, "interrupted")
