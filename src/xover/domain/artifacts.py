"""The stored artifacts a study's readers use, as typed records: their names, and one parser each from the JSON
body as stored. Pure: no I/O (the store keeps the bodies, :mod:`xover.results.read_model` hands out the records).

Each parser reads what every version of xover wrote: a field an older store lacks takes its default. A body that
cannot be read at all (not the shape of its artifact, a number that is no number) raises
:class:`UnreadableArtifact`; the read model skips it, as the readers before it did.

The writers (:mod:`xover.measure.study`, :mod:`xover.measure.tune`, :mod:`xover.measure.ttft`, ``xover predict``)
keep writing the JSON they always wrote; only :class:`StudyRecord` is also built here before it is stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from xover.domain.records import interrupted

T = TypeVar("T")

# ---- names -----------------------------------------------------------------------------------------

PREDICTION = "prediction"  # the theory's prediction, stored before any measurement (the first one counts)
TUNE = "tune"  # one per base configuration and search: the tuning stage's result
STUDY = "study"  # what the report needs of the spec: configuration order, pairs, responses, band
FIT = "fit"  # the placement planner's level of each ``fit`` configuration (a list of records)
FIT_CHECK = "fit-check"  # the same records with llama.cpp's word on each level
FOR_CACHED_SUFFIX = " tuned for cached turns"  # a variant tuned for the study's cached agentic turns (its name's end)
TUNED = "-tuned"  # the suffix of the fit artifacts of the tuned variants (placed again for their own settings)
TTFT_SKIPPED = "ttft-skipped"  # one per cold TTFT point a max-ttft skipped
TTFT_EFFICIENCY = "ttft-efficiency"  # one per round's server: its wall, load and request seconds, CPU shares
WORKLOAD = "workload"  # a study of a recording (``[study] workload``): its turns, as the recording counted them

TUNE_SCHEMA = "xover.tune/1"
FIT_SUFFIXES = ("", TUNED)  # the study's configurations, then their tuned variants
DEFAULT_UBATCH = 512  # llama.cpp's, for fit records older than the ubatch they were planned for


def fit_artifact(suffix: str = "", checked: bool = False) -> str:
    """The name of a fit artifact: the planner's records (``fit``), or llama.cpp's check of them
    (``fit-check``); ``suffix`` :data:`TUNED` for the tuned variants'."""
    if suffix not in FIT_SUFFIXES:
        raise ValueError(f"fit artifacts have no suffix {suffix!r}")
    return (FIT_CHECK if checked else FIT) + suffix


class UnreadableArtifact(ValueError):
    """A stored body that is not what its artifact holds (written by another version, or damaged)."""


def readable(parse: Callable[[Any], T], body: Any) -> T | None:
    """``parse(body)``, or None where the body cannot be read."""
    try:
        return parse(body)
    except UnreadableArtifact:
        return None


def _mapping(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise UnreadableArtifact(f"a {what} artifact holds a {type(body).__name__}, not an object")
    return body


def _reading(what: str, read: Callable[[], T]) -> T:
    """``read()``, its KeyError, TypeError or ValueError told as :class:`UnreadableArtifact`."""
    try:
        return read()
    except UnreadableArtifact:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreadableArtifact(f"a {what} artifact could not be read ({type(exc).__name__}: {exc})") from exc


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _opt_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values or ())


# How a flat record's field is read, by its declared type.
_FIELD_READERS: dict[str, Callable[[Any], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "str | None": _opt_str,
    "int | None": _opt_int,
    "bool | None": _opt_bool,
    "tuple[int, ...]": _ints,
}


def _flat(cls: type[T], body: Any, what: str) -> T:
    """A flat record from its stored object, each field read as its declared type says: a field with a default that
    the body lacks, or holds as null, takes its default; a field without one that is missing or unreadable makes
    the body :class:`UnreadableArtifact`."""
    b = _mapping(body, what)

    def read() -> T:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if b.get(f.name) is None and f.default is not dataclasses.MISSING:
                continue
            values[f.name] = _FIELD_READERS[str(f.type)](b[f.name])
        return cls(**values)

    return _reading(what, read)


# ---- the prediction --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PredictionEntry:
    """One configuration of a prediction (an entry of its ``configs``): its label, what the theory modelled of
    it (:class:`xover.analysis.theory.Offload`'s fields; None where an older prediction lacks one), and its
    points and curve as stored."""

    label: str
    study_label: str | None  # the study's own label of it (the study's theory stage stores it)
    n_cpu_moe: int | None
    op_offload: bool | None
    ubatch: int | None
    pinned: bool | None
    op_offload_min_batch: int | None
    points: tuple[Mapping[str, Any], ...]  # at the requested lengths: {length, <metric>..., fits}
    curve: Mapping[str, Sequence[float]]  # {length: [...], <metric>: [...]} on a denser grid
    body: Mapping[str, Any]  # the entry as stored

    @property
    def shown_label(self) -> str:
        """The label a study's report names it by: the study's own where stored."""
        return self.label if self.study_label is None else self.study_label

    @classmethod
    def from_body(cls, body: Any) -> PredictionEntry:
        b = _mapping(body, PREDICTION)

        def read() -> PredictionEntry:
            curve = b.get("curve") or {}
            return cls(
                label=str(b["label"]),
                study_label=_opt_str(b.get("study_label")),
                n_cpu_moe=_opt_int(b.get("n_cpu_moe")),
                op_offload=_opt_bool(b.get("op_offload")),
                ubatch=_opt_int(b.get("ubatch")),
                pinned=_opt_bool(b.get("pinned")),
                op_offload_min_batch=_opt_int(b.get("op_offload_min_batch")),
                points=tuple(_mapping(p, PREDICTION) for p in b.get("points") or ()),
                curve={str(k): tuple(v) for k, v in _mapping(curve, PREDICTION).items()},
                body=b,
            )

        return _reading(PREDICTION, read)


@dataclasses.dataclass(frozen=True)
class PredictedCrossover:
    """Where the theory put a pair's crossings (an entry of a prediction's ``crossovers``)."""

    a: str
    b: str
    lengths: tuple[int, ...] = ()
    faster_short: str | None = None
    faster_long: str | None = None
    max_length: int | None = None

    @classmethod
    def from_body(cls, body: Any) -> PredictedCrossover:
        return _flat(cls, body, PREDICTION)


@dataclasses.dataclass(frozen=True, eq=False)
class Prediction(Mapping[str, Any]):
    """The theory's prediction as stored (artifact ``prediction``; the dict
    :func:`xover.analysis.theory.build_prediction` returned, plus ``measurements_before`` where ``xover predict``
    stored it). Its top-level fields are typed; it is also the mapping it was read from, so
    :func:`xover.analysis.theory.predicted_value` reads it as it reads that dict, and it equals that dict."""

    schema: str
    created_at: str | None
    created_unix_ns: int  # 0 where not stored
    model: Mapping[str, Any]
    hardware: Mapping[str, Any] | None  # Hardware.to_dict(); None where not stored
    assumptions: tuple[str, ...]
    response_tokens: int | None
    pp_tokens: int | None
    lengths: tuple[int, ...]
    configs: tuple[PredictionEntry, ...]
    crossovers: tuple[PredictedCrossover, ...]
    measurements_before: int | None  # measurements already in the study when ``xover predict`` stored it
    body: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.body[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.body)

    def __len__(self) -> int:
        return len(self.body)

    def relabelled(self) -> Prediction:
        """The prediction with each configuration under the study's own label (where the study stored one)."""
        configs = [dict(c.body, label=c.shown_label) for c in self.configs]
        return Prediction.from_body(dict(self.body, configs=configs))

    @classmethod
    def from_body(cls, body: Any) -> Prediction:
        b = _mapping(body, PREDICTION)

        def read() -> Prediction:
            hardware, assumptions, model = b.get("hardware"), b.get("assumptions"), b.get("model")
            return cls(
                schema=str(b.get("schema") or ""),
                created_at=_opt_str(b.get("created_at")),
                created_unix_ns=int(b.get("created_unix_ns") or 0),
                model=model if isinstance(model, Mapping) else {},
                hardware=hardware if isinstance(hardware, Mapping) else None,
                assumptions=tuple(str(a) for a in assumptions) if isinstance(assumptions, list) else (),
                response_tokens=_opt_int(b.get("response_tokens")),
                pp_tokens=_opt_int(b.get("pp_tokens")),
                lengths=_ints(b.get("lengths")),
                configs=tuple(PredictionEntry.from_body(c) for c in b.get("configs") or ()),
                crossovers=tuple(PredictedCrossover.from_body(c) for c in b.get("crossovers") or ()),
                measurements_before=_opt_int(b.get("measurements_before")),
                body=b,
            )

        return _reading(PREDICTION, read)


# ---- the tuning stage ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TuneRecord:
    """One base configuration's tuning, as stored (artifact ``tune``)."""

    config: str
    variant: str | None  # the tuned variant's label; None: the search kept llama.cpp's defaults
    setting_label: str
    server_command: str
    env: tuple[tuple[str, str], ...]
    response: int | None
    depths: tuple[int, ...]
    chunk: int | None
    workload: str
    search: Any | None  # xover.analysis.advise.Search; None when not stored, not read, or unreadable
    note: str = ""  # why the search is missing
    placed_trials: bool = False  # under a budget each trial was placed for its own ubatch (a fit configuration)
    signature: str | None = None  # the key of the configuration tuned: a rerun reuses the result while it is unchanged
    setting: tuple[tuple[str, str], ...] = ()  # the recommended setting (knob, value)
    knobs: tuple[Mapping[str, Any], ...] = ()  # the searched xover.analysis.advise.Knob, as stored
    server_args: tuple[str, ...] = ()
    backend: str = ""
    # the search's recommendation against the defaults in rounds of fresh processes (xover.measure.tune.Confirmation,
    # as stored: rounds, ratio, low, high, n, kept, failure); None: stored before rounds, or nothing to confirm
    confirmation: Mapping[str, Any] | None = None
    # where the recommendation added knobs on top of the configuration's own knobs as the search moved them (its
    # origin) and that was not confirmed against the origin: the origin against the defaults (None: not needed)
    origin_confirmation: Mapping[str, Any] | None = None
    # The variant tuned for decode-heavy turns, where decode's best setting is not the whole turn's (None: none):
    # its label, setting, command, and its confirmation in rounds against the recommendation (or the defaults)
    decode_variant: str | None = None
    decode_setting: tuple[tuple[str, str], ...] = ()
    decode_setting_label: str = ""
    decode_server_command: str = ""
    decode_confirmation: Mapping[str, Any] | None = None
    skipped: tuple[tuple[str, str], ...] = ()  # (knob, why) for each knob the search left out on this machine
    # (depth, seconds it would have added) for each depth the search left out to stay within its share of the budget
    depths_left_out: tuple[tuple[int, float], ...] = ()
    # the study's configuration whose command the recommendation runs: the study's rounds of fresh servers compare
    # the two, so no llama-bench rounds confirmed it (None: confirmed here, or nothing to confirm)
    same_as: str | None = None
    # the study's configuration whose command the search's origin runs (an own knob it moved first), where the
    # recommendation extends that origin and only what it adds was confirmed in llama-bench rounds: the origin's
    # gain over this configuration rests on the study's rounds of that configuration (None: none such)
    origin_same_as: str | None = None
    # the reasons of the search's and its confirmations' llama-bench processes that were interrupted (killed by a
    # signal xover did not send, and again in the fresh process that retried them): the tuning is incomplete, and a
    # rerun searches again, reusing what was measured (xover.domain.records.interrupted)
    interrupted: tuple[str, ...] = ()

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants this tuning added to the study: the tuned one, then the one tuned for decode."""
        return tuple(v for v in (self.variant, self.decode_variant) if v)

    @classmethod
    def from_body(cls, body: Any, read_search: Callable[[Any], Any] | None = None) -> TuneRecord:
        """The record of a ``tune`` body; ``read_search`` turns the stored search into
        :class:`xover.analysis.advise.Search` (a layer above this one), and where it fails the record says why
        in ``note``. Without it the search is not read."""
        b = _mapping(body, TUNE)
        if b.get("schema") != TUNE_SCHEMA or "config" not in b:
            raise UnreadableArtifact(f"a {TUNE} artifact of another schema ({b.get('schema')!r})")
        search, note = None, ""
        if b.get("search") is not None and read_search is not None:
            try:
                search = read_search(b["search"])
            except Exception as exc:  # a store written by another version: show what can be shown
                note = f"the stored search could not be read ({type(exc).__name__}: {exc})"

        def read() -> TuneRecord:
            return cls(
                config=str(b["config"]),
                variant=_opt_str(b.get("variant")),
                setting_label=str(b.get("setting_label", "")),
                server_command=str(b.get("server_command", "")),
                env=tuple((str(k), str(v)) for k, v in b.get("env") or ()),
                response=_opt_int(b.get("response")),
                depths=_ints(b.get("depths")),
                chunk=_opt_int(b.get("chunk")),
                workload=str(b.get("workload", "")),
                search=search,
                note=note,
                placed_trials=bool(b.get("placed_trials", False)),
                signature=_opt_str(b.get("signature")),
                setting=tuple((str(k), str(v)) for k, v in b.get("setting") or ()),
                knobs=tuple(_mapping(k, TUNE) for k in b.get("knobs") or ()),
                server_args=tuple(str(a) for a in b.get("server_args") or ()),
                backend=str(b.get("backend") or ""),
                confirmation=_mapping(b["confirmation"], TUNE) if b.get("confirmation") is not None else None,
                origin_confirmation=(
                    _mapping(b["origin_confirmation"], TUNE) if b.get("origin_confirmation") is not None else None
                ),
                decode_variant=_opt_str(b.get("decode_variant")),
                decode_setting=tuple((str(k), str(v)) for k, v in b.get("decode_setting") or ()),
                decode_setting_label=str(b.get("decode_setting_label", "")),
                decode_server_command=str(b.get("decode_server_command", "")),
                decode_confirmation=(
                    _mapping(b["decode_confirmation"], TUNE) if b.get("decode_confirmation") is not None else None
                ),
                skipped=tuple((str(k), str(v)) for k, v in b.get("skipped") or ()),
                depths_left_out=tuple((int(d), float(s)) for d, s in b.get("depths_left_out") or ()),
                same_as=_opt_str(b.get("same_as")),
                origin_same_as=_opt_str(b.get("origin_same_as")),
                interrupted=_interrupted_in(b),
            )

        return _reading(TUNE, read)


def latest_tunes(bodies: Sequence[Any], read_search: Callable[[Any], Any] | None = None) -> tuple[TuneRecord, ...]:
    """The latest ``tune`` body of each base configuration (of this schema), in the order the configurations
    first appear, read (:meth:`TuneRecord.from_body`); one that cannot be read is left out."""
    latest: dict[str, Any] = {}
    for body in bodies:
        if isinstance(body, Mapping) and body.get("schema") == TUNE_SCHEMA and "config" in body:
            latest[str(body["config"])] = body
    found = (readable(lambda b: TuneRecord.from_body(b, read_search), b) for b in latest.values())
    return tuple(r for r in found if r is not None)


# ---- the study's layout ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StudyRecord:
    """What the report needs of a study's spec (artifact ``study``, stored when it changed)."""

    configs: tuple[str, ...]  # the base configurations in spec order
    pairs: tuple[tuple[str, str], ...]  # the headline pairs (may be empty)
    response_tokens: tuple[int, ...]
    band: tuple[int, int] | None  # the agentic band; None where not stored as two lengths
    decode_tokens: int | None = None
    # configurations that asked llama.cpp the same as an earlier one, measured once under its name: (name, as)
    same_as: tuple[tuple[str, str], ...] = ()
    # configurations given as the user's own command line: (name, the command as given)
    commands: tuple[tuple[str, str], ...] = ()

    @property
    def turns(self) -> tuple[tuple[int, ...], tuple[int, int]] | None:
        """The response lengths and the band the study measured for; None where either is missing."""
        if not self.response_tokens or self.band is None:
            return None
        return self.response_tokens, self.band

    def to_body(self) -> dict[str, Any]:
        """The JSON the study stores."""
        body: dict[str, Any] = {
            "configs": list(self.configs),
            "pairs": [list(p) for p in self.pairs],
            "response_tokens": list(self.response_tokens),
            "band": list(self.band) if self.band is not None else [],
        }
        if self.decode_tokens is not None:
            body["decode_tokens"] = self.decode_tokens
        if self.same_as:
            body["same_as"] = [list(p) for p in self.same_as]
        if self.commands:
            body["commands"] = [list(p) for p in self.commands]
        return body

    @classmethod
    def from_body(cls, body: Any) -> StudyRecord:
        b = _mapping(body, STUDY)

        def read() -> StudyRecord:
            band = tuple(int(x) for x in b.get("band") or ())
            return cls(
                configs=tuple(str(c) for c in b.get("configs") or ()),
                pairs=tuple((str(p[0]), str(p[1])) for p in b.get("pairs") or () if len(p) == 2),
                response_tokens=_ints(b.get("response_tokens")),
                band=(band[0], band[1]) if len(band) == 2 else None,
                decode_tokens=_opt_int(b.get("decode_tokens")),
                same_as=tuple((str(p[0]), str(p[1])) for p in b.get("same_as") or () if len(p) == 2),
                commands=tuple((str(p[0]), str(p[1])) for p in b.get("commands") or () if len(p) == 2),
            )

        return _reading(STUDY, read)


# ---- fit records -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FitEstimate:
    """The planner's GPU buffers for a level (bytes)."""

    total_bytes: int
    model_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class FitLevelCheck:
    """llama.cpp's answer at one level: did llama-server load, and did it serve one ubatch-long request?"""

    n_cpu_moe: int
    loaded: bool
    served: bool
    reason: str | None  # why not
    compute_bytes: int | None = None  # the accelerator compute buffer llama.cpp logged (None: not logged)


@dataclasses.dataclass(frozen=True)
class FitParamsChoice:
    """What llama.cpp's own ``--fit`` (llama-fit-params) chose at the same context and budget."""

    args: str
    n_ctx: int | None
    n_gpu_layers: int | None
    cpu_expert_layers: tuple[int, ...]
    partial_layers: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class FitRecord:
    """One ``fit`` configuration's placement (an entry of artifact ``fit``/``fit-tuned``), with llama.cpp's word
    on it where it was checked (``fit-check``/``fit-check-tuned``: ``checks``, ``measured_at``, ``llama_fit``)."""

    config: str
    request: str  # what the spec asked: "fit", "fit@8192"
    n_ctx: int
    n_cpu_moe: int  # the planner's level
    budget_bytes: int
    headroom_bytes: int
    estimate: FitEstimate
    ubatch: int = DEFAULT_UBATCH  # the ubatch it was planned for
    checks: tuple[FitLevelCheck, ...] = ()  # llama.cpp at the level, one below, and above where it refused it
    measured_at: int | None = None  # where llama.cpp refused the planner's level: the first level above that served
    llama_fit_asked: bool = False  # whether llama-fit-params was asked (a build with it)
    llama_fit: FitParamsChoice | None = None  # its answer; None: no answer (``llama_fit_log`` says why)
    llama_fit_log: str = ""
    body: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the record as stored
    placed_by: str = ""  # "server": a tuned variant at the lowest level its own llama-server served (measured_at)
    bench_level: int | None = None  # then: the level llama-bench's placement needed (its ubatch of logits)
    server_plan: int | None = None  # then: the planner's least level for the server, where the bisection began

    @property
    def by_server(self) -> bool:
        return self.placed_by == "server"

    @property
    def level(self) -> int:
        """The level it is measured at: the planner's, unless llama.cpp refused it and a level above served, or,
        placed by its server, the lowest level that served."""
        return self.n_cpu_moe if self.measured_at is None else self.measured_at

    @property
    def limit(self) -> int | None:
        """The longest prompt a ``fit@L`` placement holds (L tokens and their response, no more); None for a
        placement of the study's whole context."""
        return int(self.request.split("@", 1)[1]) if "@" in self.request else None

    @classmethod
    def from_body(cls, body: Any) -> FitRecord:
        b = _mapping(body, FIT)

        def read() -> FitRecord:
            e = _mapping(b["estimate"], FIT)
            own = b.get("llama_fit")
            return cls(
                config=str(b["config"]),
                request=str(b.get("request") or ""),
                n_ctx=int(b["n_ctx"]),
                n_cpu_moe=int(b["n_cpu_moe"]),
                budget_bytes=int(b["budget_bytes"]),
                headroom_bytes=int(b["headroom_bytes"]),
                estimate=FitEstimate(
                    int(e["total_bytes"]),
                    int(e.get("model_bytes", 0)),
                    int(e.get("kv_bytes", 0)),
                    int(e.get("compute_bytes", 0)),
                ),
                ubatch=int(b.get("ubatch", DEFAULT_UBATCH)),
                checks=tuple(
                    FitLevelCheck(
                        int(c["n_cpu_moe"]),
                        bool(c.get("loaded")),
                        bool(c.get("served")),
                        _opt_str(c.get("reason")),
                        _opt_int(c.get("compute_bytes")),
                    )
                    for c in b.get("checks") or ()
                ),
                measured_at=_opt_int(b.get("measured_at")),
                llama_fit_asked="llama_fit" in b,
                llama_fit=None
                if own is None
                else FitParamsChoice(
                    str(own.get("args", "")),
                    _opt_int(own.get("n_ctx")),
                    _opt_int(own.get("n_gpu_layers")),
                    _ints(own.get("cpu_expert_layers")),
                    _ints(own.get("partial_layers")),
                ),
                llama_fit_log=str(b.get("llama_fit_log") or ""),
                body=b,
                placed_by=str(b.get("placed_by") or ""),
                bench_level=_opt_int(b.get("bench_level")),
                server_plan=_opt_int(b.get("server_plan")),
            )

        return _reading(FIT, read)


def fit_records(body: Any) -> tuple[FitRecord, ...]:
    """The records of one fit artifact (a list of them)."""
    if not isinstance(body, list):
        raise UnreadableArtifact(f"a {FIT} artifact holds a {type(body).__name__}, not a list")
    return tuple(FitRecord.from_body(r) for r in body)


# ---- skipped points --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SkippedPoint:
    """A cold TTFT point a max-ttft skipped (artifact ``ttft-skipped``): its estimate, scaled linearly from the
    longest shorter length measured, exceeded the cap."""

    config: str  # the configuration's label
    length: int
    estimate_s: float
    from_length: int  # the length the estimate was scaled from
    max_ttft_s: float
    config_key: str = ""
    rep: int = 0

    def to_body(self) -> dict[str, Any]:
        """The JSON the TTFT runner stores."""
        return dataclasses.asdict(self)

    @classmethod
    def from_body(cls, body: Any) -> SkippedPoint:
        return _flat(cls, body, TTFT_SKIPPED)


@dataclasses.dataclass(frozen=True)
class WorkloadRecord:
    """The recording a study was sized from (artifact ``workload``): per turn the prompt's tokens, the prefix the
    recording server took from its cache and the answer's tokens; what the report answers in minutes for."""

    file: str  # the recording's file name
    session_id: str  # its content hash (xover.domain.workload.session_id)
    kind: str  # "full", "shape-only" or "log" (xover record --from-log)
    turns: tuple[tuple[int, int, int], ...]  # (prompt, cached, answer)

    def to_body(self) -> dict[str, Any]:
        return {"file": self.file, "session_id": self.session_id, "kind": self.kind,
                "turns": [list(t) for t in self.turns]}  # fmt: skip

    @classmethod
    def from_body(cls, body: Any) -> WorkloadRecord:
        b = _mapping(body, WORKLOAD)
        turns = b.get("turns")
        if not isinstance(turns, list) or not all(
            isinstance(t, list) and len(t) == 3 and all(isinstance(x, int) for x in t) for t in turns
        ):
            raise UnreadableArtifact("a workload artifact's turns must be [prompt, cached, answer] lists")
        return cls(str(b.get("file", "")), str(b.get("session_id", "")), str(b.get("kind", "")),
                   tuple((t[0], t[1], t[2]) for t in turns))  # fmt: skip


def _interrupted_in(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The interrupted measurements a ``tune`` body holds: failed trials of its search and failed confirmations
    whose reason is :func:`xover.domain.records.interrupted`, each reason once."""
    reasons: list[str] = []
    search = body.get("search")
    trials = search.get("trials") if isinstance(search, Mapping) else None
    for t in trials if isinstance(trials, list) else ():
        m = t.get("measurement") if isinstance(t, Mapping) else None
        reasons.append(str(m.get("failure") or "") if isinstance(m, Mapping) else "")
    for key in ("confirmation", "origin_confirmation", "decode_confirmation"):
        c = body.get(key)
        reasons.append(str(c.get("failure") or "") if isinstance(c, Mapping) else "")
    return tuple(dict.fromkeys(r for r in reasons if interrupted(r)))
