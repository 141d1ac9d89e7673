"""Which llama-bench and llama-server to run for each build (an engine and a backend), and why.

Resolution order, per build: ``--llama-bin-dir`` (``xover study``: ``--llama-bin-dir BUILD=DIR`` for each build,
:func:`resolve_chosen`; a build is ``ENGINE``, ``BACKEND`` (mainline's) or ``ENGINE:BACKEND``) > its engine's
variable (:data:`ENV_VARS`: ``$XOVER_LLAMA_BIN_DIR``, ``$XOVER_IK_LLAMA_BIN_DIR``) > its newest cached xover build >
``PATH`` (mainline only: an ik_llama.cpp build installs the same binary names); an engine's default build (no
backend named) is its newest cached build by :data:`DEFAULT_RANK`. Where the build names a backend, a
folder is taken only if it was built for that backend (the ggml library beside the binaries says so; a folder that
cannot tell is taken, and every record it produces is checked against the backend anyway). A user's own build
directory (``--llama-bin-dir hip=./build-hip/bin``) works unchanged through the first two.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from xover.domain.config import LlamaConfig
from xover.domain.llama_options import BACKENDS, ENGINE, build_name
from xover.errors import XoverError
from xover.llamacpp.build import BuildManifest, backend_of_dir, cached_builds

ENV_VAR = "XOVER_LLAMA_BIN_DIR"
ENV_VARS: dict[str, str] = {"llama.cpp": ENV_VAR, "ik_llama.cpp": "XOVER_IK_LLAMA_BIN_DIR"}
"""Each engine's variable naming its binaries' folder."""
RPC_SERVER = "ggml-rpc-server"  # tools/rpc's target and binary


@dataclasses.dataclass(frozen=True)
class Binaries:
    bench: Path
    server: Path
    source: str  # "--llama-bin-dir", "$XOVER_LLAMA_BIN_DIR", "cache", "PATH"
    manifest: BuildManifest | None = None
    engine: str = "llama.cpp"
    # the folders given per build on the command line (``--llama-bin-dir ik_llama.cpp=DIR``, ``vulkan=DIR``):
    # build name (:func:`build_name`) -> folder
    chosen: tuple[tuple[str, Path], ...] = ()
    backend: str | None = None  # the backend it was built for (its manifest's, else the folder's library's)
    asked: str | None = None  # the backend a configuration asked for, where it named one

    def for_build(self, engine: str, backend: str | None = None) -> Binaries:
        """The binaries of the build ``engine`` + ``backend`` (None: the engine's default build): these, or that
        build's own (its folder from the command line, else its engine's variable, else its cached build)."""
        if engine == self.engine and backend in (None, self.asked):
            return self
        if engine == self.engine and backend is not None and self.asked is None and self.backend == backend:
            return dataclasses.replace(self, asked=backend)
        return dataclasses.replace(resolve_build(dict(self.chosen), engine, backend), chosen=self.chosen)

    @property
    def expected_backend(self) -> str | None:
        """The backend every number of these binaries is checked against: the one a configuration asked for, else
        the one they were built for (None: not known, nothing is checked)."""
        return self.asked or self.backend

    def for_config(self, config: LlamaConfig) -> Binaries:
        """The binaries of a configuration's build (:attr:`LlamaConfig.build`)."""
        return self.for_build(*config.build)

    @property
    def bin_dir(self) -> Path:
        return self.server.parent

    @property
    def fit_params(self) -> Path | None:
        """llama.cpp's ``llama-fit-params`` beside llama-server, if this build has it (xover's builds do)."""
        p = self.bin_dir / "llama-fit-params"
        return p if p.is_file() and os.access(p, os.X_OK) else None

    @property
    def rpc_server(self) -> Path | None:
        """llama.cpp's ``ggml-rpc-server`` (an RPC worker) beside llama-server, if this build has it (xover's builds
        do: ``-DGGML_RPC=ON``), else the one on ``PATH``, else None."""
        p = self.bin_dir / RPC_SERVER
        if p.is_file() and os.access(p, os.X_OK):
            return p
        found = shutil.which(RPC_SERVER)
        return Path(found).resolve() if found else None

    def describe(self) -> str:
        where = {"--llama-bin-dir": "from --llama-bin-dir", "cache": "xover build cache", "PATH": "found on PATH"}.get(
            self.source, f"from {self.source}"
        )
        rpc = self.rpc_server
        line = (
            f"llama-bench:  {self.bench}\nllama-server: {self.server}\n"
            f"rpc-server:   {rpc if rpc is not None else f'none ({RPC_SERVER} not built: -DGGML_RPC=ON)'}\n"
            f"source:       {where}"
        )
        if self.backend is not None and self.manifest is None:
            line += f"\nbackend:      {self.backend} (the ggml library beside the binaries)"
        if self.manifest is not None:
            m = self.manifest
            line += (
                f"\nbuild:        {m.backend}, {m.engine} {m.commit[:7]} (build {m.build_number}), from {m.origin}"
                f"\ncmake:        {' '.join(m.cmake_args)}"
            )
        return line


def _from_dir(d: Path, source: str) -> Binaries:
    d = d.expanduser()
    bench, server = d / "llama-bench", d / "llama-server"
    missing = [p.name for p in (bench, server) if not (p.is_file() and os.access(p, os.X_OK))]
    if missing:
        raise XoverError(
            f"{d} ({source}) has no executable {' or '.join(missing)}: point it at the folder holding both, e.g. build/bin"
        )
    return Binaries(bench=bench.resolve(), server=server.resolve(), source=source, backend=backend_of_dir(d))


def parse_build_name(name: str) -> tuple[str, str | None]:
    """``ENGINE``, ``BACKEND`` (mainline's build for it) or ``ENGINE:BACKEND`` -> (engine, backend or None); a
    one-line error for anything else."""
    engine, _, backend = name.partition(":")
    if not backend and engine in BACKENDS:
        engine, backend = ENGINE, engine
    if engine not in ENV_VARS or (backend and backend not in BACKENDS):
        raise XoverError(
            f"{name!r} names no build: use an engine ({', '.join(ENV_VARS)}), a backend ({', '.join(BACKENDS)}) "
            "or ENGINE:BACKEND"
        )
    return engine, backend or None


DEFAULT_RANK = {"cpu": 1, "vulkan": 2}
"""Which cached build is an engine's default (a configuration naming no backend), the newest within a rank: a
native GPU build (CUDA, HIP, Metal) first, then the CPU's, then Vulkan's. A Vulkan build is mostly made beside
another to compare with it (on a machine without a GPU it finds no device), so it is the default only alone."""


def resolve_chosen(dirs: dict[str, Path]) -> Binaries:
    """Mainline's binaries (its folder in ``dirs``, else its usual order), remembering every folder ``dirs`` gives
    (build name -> folder) for :meth:`Binaries.for_build`; each folder is checked now, so a wrong one fails before
    a run."""
    for name, d in dirs.items():
        engine, backend = parse_build_name(name)
        b = _from_dir(d, "--llama-bin-dir")
        if backend is not None and b.backend not in (None, backend):
            raise XoverError(
                f"--llama-bin-dir {name}={d}: that folder holds a {b.backend} build (its ggml library says so), not "
                f"{backend}: point it at the {backend} build's bin folder"
            )
    chosen = tuple(sorted(dirs.items()))
    return dataclasses.replace(resolve_build(dict(chosen), ENGINE, None), chosen=chosen)


def resolve_build(chosen: dict[str, Path], engine: str, backend: str | None) -> Binaries:
    """The binaries of ``engine`` + ``backend`` given the folders chosen on the command line (build name ->
    folder): the build's own folder, else its engine's variable, newest cached build or PATH, each taken only if
    it was built for ``backend`` (None: any)."""
    for name in (build_name(engine, backend), *((backend,) if backend and engine == ENGINE else ()), engine):
        if name in chosen:
            b = _from_dir(chosen[name], "--llama-bin-dir")
            if backend is None or b.backend in (None, backend):
                return dataclasses.replace(b, engine=engine, asked=backend)
    return dataclasses.replace(resolve(None, engine, backend), asked=backend)


def resolve(bin_dir: Path | None = None, engine: str = "llama.cpp", backend: str | None = None) -> Binaries:
    """The binaries xover will use for ``engine`` (built for ``backend``, where it names one); raises with what to
    do when there are none."""
    var = ENV_VARS.get(engine)
    if var is None:
        raise XoverError(f"unknown engine {engine!r}: use one of {', '.join(ENV_VARS)}")
    if bin_dir is not None:
        return dataclasses.replace(_from_dir(bin_dir, "--llama-bin-dir"), engine=engine)

    def fits(b: Binaries) -> bool:
        return backend is None or b.backend in (None, backend)

    env = os.environ.get(var)
    if env and fits(found := _from_dir(Path(env), f"${var}")):
        return dataclasses.replace(found, engine=engine)
    for manifest in sorted(cached_builds(engine=engine), key=lambda m: DEFAULT_RANK.get(m.backend, 0)):
        if backend is None or manifest.backend == backend:
            b = _from_dir(Path(manifest.bin_dir), "cache")
            return dataclasses.replace(b, manifest=manifest, engine=engine, backend=manifest.backend)
    if engine == "llama.cpp":
        bench, server = shutil.which("llama-bench"), shutil.which("llama-server")
        if bench and server:
            found = Binaries(
                bench=Path(bench).resolve(), server=Path(server).resolve(), source="PATH",
                backend=backend_of_dir(Path(bench).parent),
            )  # fmt: skip
            if fits(found):
                return found
    what = engine if backend is None else f"{engine} {backend}"
    flag = "" if engine == ENGINE else f" --engine {engine}"
    flag += "" if backend is None else f" --backend {backend}"
    if engine == "llama.cpp" and backend is None:
        raise XoverError(
            "no llama-bench/llama-server found: run `xover llama build`, or pass --llama-bin-dir DIR "
            f"(or set {ENV_VAR}) to use your own build"
        )
    raise XoverError(
        f"no {what} build found: run `xover llama build{flag}`, or pass --llama-bin-dir "
        f"{build_name(engine, backend)}=DIR with the folder holding its llama-bench and llama-server"
    )
