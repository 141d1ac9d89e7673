"""Which llama-bench and llama-server to run for each engine, and why.

Resolution order, per engine: ``--llama-bin-dir`` (``xover study``: ``--llama-bin-dir ENGINE=DIR`` for each
engine, :func:`resolve_chosen`) > its variable (:data:`ENV_VARS`: ``$XOVER_LLAMA_BIN_DIR``,
``$XOVER_IK_LLAMA_BIN_DIR``) > its newest cached xover build > ``PATH`` (mainline only: an ik_llama.cpp build
installs the same binary names). A user's own build directory (``./build-hip/bin``) works unchanged through the
first two.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from xover.errors import XoverError
from xover.llamacpp.build import BuildManifest, cached_builds

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
    # the folders given per engine on the command line (``--llama-bin-dir ik_llama.cpp=DIR``): engine -> folder
    chosen: tuple[tuple[str, Path], ...] = ()

    def for_engine(self, engine: str) -> Binaries:
        """The binaries of ``engine``: these, or that engine's own (its folder from the command line, else its
        variable, else its cached build)."""
        if engine == self.engine:
            return self
        return dataclasses.replace(resolve(dict(self.chosen).get(engine), engine), chosen=self.chosen)

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
    return Binaries(bench=bench.resolve(), server=server.resolve(), source=source)


def resolve_chosen(dirs: dict[str, Path]) -> Binaries:
    """Mainline's binaries (``dirs["llama.cpp"]`` or its usual order), remembering every folder ``dirs`` gives for
    :meth:`Binaries.for_engine`; each folder is checked now, so a wrong one fails before a run."""
    for engine, d in dirs.items():
        if engine != "llama.cpp":  # mainline's is resolved below
            resolve(d, engine)
    return dataclasses.replace(resolve(dirs.get("llama.cpp")), chosen=tuple(sorted(dirs.items())))


def resolve(bin_dir: Path | None = None, engine: str = "llama.cpp") -> Binaries:
    """The binaries xover will use for ``engine``; raises with what to do when there are none."""
    var = ENV_VARS.get(engine)
    if var is None:
        raise XoverError(f"unknown engine {engine!r}: use one of {', '.join(ENV_VARS)}")
    if bin_dir is not None:
        return dataclasses.replace(_from_dir(bin_dir, "--llama-bin-dir"), engine=engine)
    env = os.environ.get(var)
    if env:
        return dataclasses.replace(_from_dir(Path(env), f"${var}"), engine=engine)
    for manifest in cached_builds(engine=engine):
        b = _from_dir(Path(manifest.bin_dir), "cache")
        return dataclasses.replace(b, manifest=manifest, engine=engine)
    if engine == "llama.cpp":
        bench, server = shutil.which("llama-bench"), shutil.which("llama-server")
        if bench and server:
            return Binaries(bench=Path(bench).resolve(), server=Path(server).resolve(), source="PATH")
        raise XoverError(
            "no llama-bench/llama-server found: run `xover llama build`, or pass --llama-bin-dir DIR "
            f"(or set {ENV_VAR}) to use your own build"
        )
    raise XoverError(
        f"no {engine} build found: run `xover llama build --engine {engine}`, or set {var} to the folder holding "
        "its llama-bench and llama-server"
    )
