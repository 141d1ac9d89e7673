"""Which llama-bench and llama-server to run, and why.

Resolution order: ``--llama-bin-dir`` > ``$XOVER_LLAMA_BIN_DIR`` > newest cached xover build > ``PATH``.
A user's own build directory (``./build-hip/bin``) works unchanged through the first two.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from xover.errors import XoverError
from xover.llamacpp.build import BuildManifest, cached_builds

ENV_VAR = "XOVER_LLAMA_BIN_DIR"
RPC_SERVER = "ggml-rpc-server"  # tools/rpc's target and binary


@dataclasses.dataclass(frozen=True)
class Binaries:
    bench: Path
    server: Path
    source: str  # "--llama-bin-dir", "$XOVER_LLAMA_BIN_DIR", "cache", "PATH"
    manifest: BuildManifest | None = None

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
        where = {
            "--llama-bin-dir": "from --llama-bin-dir",
            "$XOVER_LLAMA_BIN_DIR": f"from ${ENV_VAR}",
            "cache": "xover build cache",
            "PATH": "found on PATH",
        }[self.source]
        rpc = self.rpc_server
        line = (
            f"llama-bench:  {self.bench}\nllama-server: {self.server}\n"
            f"rpc-server:   {rpc if rpc is not None else f'none ({RPC_SERVER} not built: -DGGML_RPC=ON)'}\n"
            f"source:       {where}"
        )
        if self.manifest is not None:
            m = self.manifest
            line += (
                f"\nbuild:        {m.backend}, llama.cpp {m.commit[:7]} (build {m.build_number}), from {m.origin}"
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


def resolve(bin_dir: Path | None = None) -> Binaries:
    """The binaries xover will use; raises with what to do when there are none."""
    if bin_dir is not None:
        return _from_dir(bin_dir, "--llama-bin-dir")
    env = os.environ.get(ENV_VAR)
    if env:
        return _from_dir(Path(env), "$XOVER_LLAMA_BIN_DIR")
    for manifest in cached_builds():
        b = _from_dir(Path(manifest.bin_dir), "cache")
        return dataclasses.replace(b, manifest=manifest)
    bench, server = shutil.which("llama-bench"), shutil.which("llama-server")
    if bench and server:
        return Binaries(bench=Path(bench).resolve(), server=Path(server).resolve(), source="PATH")
    raise XoverError(
        "no llama-bench/llama-server found: run `xover llama build`, or pass --llama-bin-dir DIR "
        f"(or set {ENV_VAR}) to use your own build"
    )
