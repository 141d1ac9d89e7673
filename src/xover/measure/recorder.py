"""One run's lifecycle in the results store, the same for every runner (bench, ttft, cache lab, session).

A :class:`Recording` is the ``runs`` row of one ``xover bench`` / ``ttft`` / ``cache`` / ``session``
invocation (or study stage), one row per engine it ran, and the failures and artifacts stored under it::

    with Recording(store, "ttft", command, binaries=binaries, model=model, on_event=on_event) as rec:
        ...  # rec.ensure(props=...) / rec.fail(config, failure) / rec.artifact(name, body)
    rec.run_id  # the outcome's run (the first, where its configurations ran on two engines)

* **Begun lazily**, at the first thing to store (:meth:`Recording.ensure`), so that its provenance
  carries the build identity the binaries report themselves: llama-bench's first JSON record, or a
  llama-server's ``/props`` ``build_info``; the build manifest's when a failure comes first.
* **One run per engine.** A runner whose configurations run on two engines (mainline and ik_llama.cpp) begins a
  run for each, at the first thing it stores for a configuration of that engine, so that each run's provenance
  names the binaries that produced its numbers. :attr:`Recording.run_id` is the first of them. Whatever stores
  something for a configuration passes its engine (``ensure``, ``artifact``); without one it goes to the first run.
  Each run ends with its own status (below): a failure on one engine leaves the other's run ``done``.
* **Failures** are stored the moment they happen, with their configuration (:meth:`Recording.fail`),
  and announced as :class:`xover.measure.events.ConfigFailed`.
* **Ended** when the ``with`` block is left, with one meaning of its status:

  - ``interrupted``: the block was left by an exception (Ctrl-C, cancellation, a bug). Everything stored
    before it stays and the exception goes on; a run not yet begun stays unwritten.
  - ``failed``: the block finished and at least one failure was recorded, whatever else was measured.
  - ``done``: the block finished and no failure was recorded.

  With ``always`` (ttft, session, cache lab: their outcome names its run) the run is written even when
  nothing was stored; without it (the llama-bench sweep) a run with nothing to store is never written.

This is the rule ttft, session and the cache lab followed before they shared it. The llama-bench sweep
used to end a run ``failed`` only when nothing at all was stored (a sweep with one configuration failed
and another measured was ``done``), and ``interrupted`` only on Ctrl-C (another exception left it
``running``); it now follows the rule above.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from xover.domain.config import LlamaConfig
from xover.domain.records import Failure
from xover.errors import XoverError
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import parse_build_info
from xover.measure.events import ConfigFailed
from xover.measure.provenance import collect
from xover.results.store import Store

PROPS_ARTIFACT = "server-props"


class Recording:
    """The run of one runner in ``store``: begun lazily, failures and artifacts under it, ended once."""

    def __init__(
        self,
        store: Store,
        kind: str,
        command: Sequence[str],
        *,
        binaries: Binaries | None,
        model: Path | None,
        always: bool = True,
        on_event: Callable[[ConfigFailed], None] = lambda ev: None,
        load: tuple[tuple[str, str], ...] | None = None,
    ) -> None:
        self.store = store
        self.kind = kind
        self.command = list(command)
        self.binaries = binaries
        self.model = model
        self.always = always
        self.on_event = on_event
        self.load = load  # the machine's load before the run's first process (provenance.machine_load), if sampled
        self.run_id: int | None = None  # the first run begun
        # build (engine, backend) -> its run, begun at the first thing stored for that build
        self.runs: dict[tuple[str, str | None], int] = {}
        self._failed: set[int] = set()  # the runs a failure was stored under
        self.model_key = ""  # the model's key in the store, known once the run is begun
        self.failures: list[Failure] = []

    def __enter__(self) -> Recording:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:  # Ctrl-C, cancellation or a bug: what was stored stays; the run says so
            for run_id in self.runs.values():
                self.store.end_run(run_id, "interrupted")
            return
        if self.run_id is None and not self.always:
            return
        self.ensure()
        for run_id in self.runs.values():
            self.store.end_run(run_id, "failed" if run_id in self._failed else "done")

    def ensure(
        self,
        build_info: Mapping[str, Any] | None = None,
        *,
        props: Mapping[str, Any] | None = None,
        build: tuple[str, str | None] | None = None,
        devices: str | None = None,
    ) -> int:
        """The id of ``build``'s run (an engine and a backend, :attr:`LlamaConfig.build`; default: the first run,
        else the binaries' own build), begun at the first call for that build with the build identity its binaries
        report: ``build_info`` (llama-bench's record, whose ``gpu_info`` names the devices) or a llama-server's
        ``props`` (its ``devices``, from its log); the rest of its provenance from that build's binaries."""
        if build is None:
            if self.run_id is not None:
                return self.run_id
            build = (self.binaries.engine if self.binaries is not None else "", None)
        engine, backend = build
        if build not in self.runs:
            if props:
                build_info = parse_build_info(props.get("build_info"))
            binaries = self.binaries
            if binaries is not None and engine:
                try:
                    binaries = binaries.for_build(engine, backend)
                except XoverError:  # that build is not here: its failure is stored, without a build
                    binaries = None
            known = engine if self.binaries is not None and engine else None  # a server at --url: not known here
            if devices is None and build_info:
                devices = str(build_info.get("gpu_info") or "") or None
            prov = collect(
                binaries,
                self.model,
                build_info=dict(build_info) if build_info else None,
                engine=known,
                backend=backend,
                devices=devices,
                load=self.load,
            )
            if prov.model is not None:
                self.model_key = prov.model.key
            elif props:  # a server at --url with no model file here
                self.model_key = f"{Path(str(props.get('model_path') or 'unknown')).name}:server"
            self.runs[build] = self.store.begin_run(self.kind, self.command, prov)
            if self.run_id is None:
                self.run_id = self.runs[build]
        return self.runs[build]

    def fail(
        self,
        config: LlamaConfig,
        failure: Failure,
        *,
        skipped: int = 0,
        mode: str | None = None,
        scenario: str | None = None,
    ) -> None:
        """Store ``failure`` (and its configuration) under the run and announce it."""
        run_id = self.ensure(build=config.build)
        self.store.put_config(config)
        self.store.add_failure(run_id, failure)
        self.failures.append(failure)
        self._failed.add(run_id)
        self.on_event(
            ConfigFailed(
                label=config.label,
                reason=failure.reason,
                skipped=skipped,
                mode=mode,
                scenario=scenario,
                config=config,
                failure=failure,
            )
        )

    def artifact(self, name: str, body: Any, *, build: tuple[str, str | None] | None = None) -> None:
        """Store an artifact under ``build``'s run (default: the first)."""
        self.store.add_artifact(self.ensure(build=build), name, body)

    def server_props(
        self, config: LlamaConfig, props: Mapping[str, Any], model_meta: Mapping[str, Any], **where: Any
    ) -> int:
        """A server answered: the run begun with its build, its configuration and its ``/props`` (and
        ``/v1/models`` meta) stored, with ``where`` (its log and pid, or its URL; the mode or scenario)."""
        run_id = self.ensure(props=props, build=config.build, devices=where.get("devices"))
        self.store.put_config(config)
        self.store.add_artifact(
            run_id,
            PROPS_ARTIFACT,
            {
                "config_key": config.key,
                "label": config.label,
                **where,
                "props": dict(props),
                "model_meta": dict(model_meta),
            },
        )
        return run_id
