"""Build llama-bench and llama-server of an engine from a pinned source taken from a package registry.

Each engine (:data:`ENGINE_SOURCES`: mainline llama.cpp, ik_llama.cpp) is one entry: the registry sdist that
vendors its tree, where in the sdist the tree sits, the targets, the cmake arguments, how a local tree is
recognised and what the sdist leaves out that the build needs. The llama-cpp-python sdist vendors the whole
llama.cpp tree (tools included) and the ik-llama-cpp-python sdist the ik_llama.cpp tree, so the ordinary
``pip download`` gives a reproducible, hash-checked source on any machine that reaches PyPI. Machines with no
registry access pass ``--source`` (the sdist file or an unpacked tree).

Cache layout (under :func:`xover.paths.cache_root`)::

    downloads/<package>-<ver>.tar.gz
    src/<engine tree>-<identity>/            unpacked tree (docs/models/media/benches left out)
    builds/<identity>-<backend>-<hash8>/     build/ (cmake tree, binaries in build/bin), manifest.json

A build is keyed by source identity (mainline: its commit; ik_llama.cpp: its sdist, which records no commit) +
backend + cmake arguments; a second call with the same key returns the manifest at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from xover.errors import BuildError
from xover.paths import cache_root


@dataclasses.dataclass(frozen=True)
class PinnedSource:
    package: str
    version: str
    sha256: str
    commit: str  # "" when the sdist records none
    build_number: int

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}.tar.gz"

    @property
    def identity(self) -> str:
        """What keys the unpacked tree and the build: the commit's 7 characters, else the package's version."""
        return self.commit[:7] if self.commit else f"{self.package.split('-')[0]}{self.version}"


# llama-cpp-python 0.3.36 vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG and the submodule HEAD
# in the sdist agree). The sdist's submodule clone is shallow, so the upstream build number cannot be
# derived offline: it is stamped as 0 and the commit carries the identity.
PINNED = PinnedSource(
    package="llama-cpp-python",
    version="0.3.36",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    commit="0c1e57098bba43ac29e6e3b677cdceebdd22334f",
    build_number=0,
)

# ik-llama-cpp-python 0.1.5 vendors ik_llama.cpp (ikawrakow/ik_llama.cpp) at vendor/ik_llama.cpp, without its git
# metadata: no commit is recorded, so the sdist's hash is the identity.
IK_PINNED = PinnedSource(
    package="ik-llama-cpp-python",
    version="0.1.5",
    sha256="33c67eb99e4dcab5e611050433243815709b8b3067753f9ce18375013cf002ad",
    commit="",  # none recorded: the sdist's sha256 is the identity
    build_number=0,
)


def _given(args: tuple[str, ...], name: str) -> str | None:
    """The value a ``-DNAME=value`` among ``args`` gives (the last one), or None."""
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"-D{name}=") or a.startswith(f"-D{name}:")]
    return found[-1] if found else None


_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
MIN_VK_HEADER = 261
"""The oldest Vulkan headers (``VK_HEADER_VERSION`` of 1.3) that build the pinned llama.cpp: its ggml_vulkan creates
its instance with ``VK_EXT_layer_settings`` (vk::LayerSettingEXT), which headers before 1.3.261 lack; Debian
bookworm's 1.3.239 fails there ('LayerSettingEXT' is not a member of 'vk'), trixie's 1.4.309 builds it."""
VK_HEADERS_DEP = "vulkan-headers"
"""Where the set-up puts newer Vulkan headers when the system's are too old (under the cache's ``deps/``: a
registry package unpacked, ``usr/include/vulkan``), and the build then takes them (:func:`vulkan_include_dir`)."""


def _vk_headers_ok(include_dir: Path) -> tuple[int | None, bool]:
    """The headers' ``VK_HEADER_VERSION`` (None: no headers) and whether they build the pinned llama.cpp (new
    enough, with ``VK_EXT_layer_settings``, and ``vulkan.hpp`` beside them)."""
    core = include_dir / "vulkan" / "vulkan_core.h"
    if not core.is_file():
        return None, False
    text = core.read_text(errors="replace")
    m = re.search(r"^#define VK_HEADER_VERSION (\d+)", text, re.MULTILINE)
    major = re.search(r"^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(0, 1, (\d+),", text, re.MULTILINE)
    version = int(m.group(1)) if m else None
    new_enough = version is not None and (version >= MIN_VK_HEADER or (major is not None and int(major.group(1)) > 3))
    ok = new_enough and "VK_EXT_layer_settings" in text and (include_dir / "vulkan" / "vulkan.hpp").is_file()
    return version, ok


def vulkan_include_dir(root: Path | None = None) -> Path | None:
    """The Vulkan headers a build takes when no ``-DVulkan_INCLUDE_DIR`` is given: ``$VULKAN_SDK/include`` or the
    system's where they build the pinned llama.cpp, else those the set-up put in the cache's ``deps/`` (None:
    neither)."""
    sdk = os.environ.get("VULKAN_SDK")
    system = Path(sdk, "include") if sdk else Path("/usr/include")
    if _vk_headers_ok(system)[1]:
        return system
    cached = (root or cache_root()) / "deps" / VK_HEADERS_DEP / "usr" / "include"
    return cached if _vk_headers_ok(cached)[1] else None


def _vulkan_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """The headers the set-up fetched, where the system's cannot build it and no argument names others."""
    if _given(args, "Vulkan_INCLUDE_DIR") is not None:
        return ()
    found = vulkan_include_dir()
    system = Path(os.environ["VULKAN_SDK"], "include") if os.environ.get("VULKAN_SDK") else Path("/usr/include")
    return (f"-DVulkan_INCLUDE_DIR={found}",) if found is not None and found != system else ()


def _vulkan_needs(args: tuple[str, ...]) -> list[str]:
    """What a Vulkan build lacks on this machine: glslc, the headers (new enough, with vulkan.hpp), the loader and
    SPIRV-Headers' CMake package, each where cmake's FindVulkan or an argument naming it would find it."""
    missing = []
    sdk = os.environ.get("VULKAN_SDK")
    glslc = (
        _given(args, "Vulkan_GLSLC_EXECUTABLE")
        or shutil.which("glslc")
        or (f"{sdk}/bin/glslc" if sdk and Path(sdk, "bin", "glslc").exists() else None)
    )
    if glslc is None or not Path(glslc).exists():
        missing.append("glslc (Debian: glslc)")
    include = _given(args, "Vulkan_INCLUDE_DIR") or (f"{sdk}/include" if sdk else "/usr/include")
    version, ok = _vk_headers_ok(Path(include))
    if version is None or not (Path(include) / "vulkan" / "vulkan.hpp").is_file():
        missing.append(f"the Vulkan headers with vulkan.hpp in {include} (Debian: libvulkan-dev)")
    elif not ok:
        missing.append(
            f"Vulkan headers 1.3.{MIN_VK_HEADER} or newer, with VK_EXT_layer_settings ({include} has 1.x.{version}; "
            "bash scripts/setup.sh fetches newer ones into xover's cache)"
        )
    lib = _given(args, "Vulkan_LIBRARY")
    dirs = (*((f"{sdk}/lib",) if sdk else ()), *_LIB_DIRS)
    if not (lib and Path(lib).exists()) and not any(Path(d, "libvulkan.so").exists() for d in dirs):
        missing.append("the Vulkan loader libvulkan.so (Debian: libvulkan-dev)")
    spirv = _given(args, "SPIRV-Headers_DIR")
    prefixes = [p for p in (_given(args, "CMAKE_PREFIX_PATH") or "").split(";") if p] + ([sdk] if sdk else [])
    places = [Path(spirv)] if spirv else []
    places += [
        Path(p, sub, "SPIRV-Headers") for p in (*prefixes, "/usr", "/usr/local") for sub in ("share/cmake", "lib/cmake")
    ]
    places += [Path(d, "cmake", "SPIRV-Headers") for d in _LIB_DIRS]
    if not any((p / "SPIRV-HeadersConfig.cmake").is_file() for p in places):
        missing.append("SPIRV-Headers' CMake package (Debian: spirv-headers)")
    return missing


def _rocm() -> Path:
    return Path(os.environ.get("ROCM_PATH") or os.environ.get("HIP_PATH") or "/opt/rocm")


def _hip_needs(args: tuple[str, ...]) -> list[str]:
    """What a HIP build lacks: ROCm's hipcc, hipBLAS and rocBLAS (under $ROCM_PATH, default /opt/rocm)."""
    rocm = _rocm()
    missing = []
    if shutil.which("hipcc") is None and not (rocm / "bin" / "hipcc").exists():
        missing.append(f"hipcc (ROCm; looked on PATH and in {rocm}/bin: set ROCM_PATH)")
    for lib, what in (("libhipblas.so", "hipBLAS"), ("librocblas.so", "rocBLAS")):
        if not (rocm / "lib" / lib).exists():
            missing.append(f"{what} ({rocm}/lib/{lib})")
    return missing


def _hip_env() -> dict[str, str]:
    """The compiler ggml's HIP build wants (llama.cpp's docs: HIPCXX is ROCm's clang, HIP_PATH its root)."""
    rocm = _rocm()
    env = {}
    if "HIPCXX" not in os.environ and (rocm / "llvm" / "bin" / "clang").exists():
        env["HIPCXX"] = str(rocm / "llvm" / "bin" / "clang")
    if "HIP_PATH" not in os.environ:
        env["HIP_PATH"] = str(rocm)
    return env


def _cuda_needs(args: tuple[str, ...]) -> list[str]:
    found = (
        _given(args, "CMAKE_CUDA_COMPILER")
        or os.environ.get("CUDACXX")
        or shutil.which("nvcc")
        or next((p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)
    )
    return [] if found else ["nvcc (the CUDA toolkit: put its bin/ on PATH or set CUDACXX)"]


@dataclasses.dataclass(frozen=True)
class BackendSource:
    """How one ggml backend is built (its traits are :data:`xover.domain.llama_options.BACKEND_TRAITS`):
    ``cmake``: its -D flags; ``library``: the shared library its build puts beside the binaries (how a folder of
    binaries tells its backend, :func:`backend_of_dir`); ``needs``: what this machine lacks to build it, given the
    cmake arguments (checked before cmake runs, so a missing dependency is one line, not a CMake trace);
    ``env``: variables the build runs with; ``args``: -D arguments it adds where this machine needs them (the
    Vulkan headers the set-up fetched), part of the build's key."""

    backend: str
    cmake: tuple[str, ...]
    library: str | None = None
    needs: Callable[[tuple[str, ...]], list[str]] | None = None
    env: Callable[[], dict[str, str]] | None = None
    args: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None  # -D arguments found here, given the user's


BACKEND_SOURCES: dict[str, BackendSource] = {
    "cpu": BackendSource("cpu", ()),
    "cuda": BackendSource("cuda", ("-DGGML_CUDA=ON",), "libggml-cuda", _cuda_needs),
    "hip": BackendSource("hip", ("-DGGML_HIP=ON",), "libggml-hip", _hip_needs, _hip_env),
    "vulkan": BackendSource("vulkan", ("-DGGML_VULKAN=ON",), "libggml-vulkan", _vulkan_needs, args=_vulkan_args),
    "metal": BackendSource("metal", ("-DGGML_METAL=ON",), "libggml-metal"),
}
"""Every backend xover builds (the names of :data:`xover.domain.llama_options.BACKENDS`)."""
BACKENDS = tuple(BACKEND_SOURCES)


def backend_of_dir(bin_dir: Path) -> str | None:
    """The backend a folder of llama.cpp binaries was built for, from the ggml library beside them
    (``libggml-vulkan.so``), ``cpu`` where only the CPU's is there, None where it cannot tell (a static build)."""
    for source in BACKEND_SOURCES.values():
        if source.library and any(bin_dir.glob(f"{source.library}.*")):
            return source.backend
    return "cpu" if any(bin_dir.glob("libggml-cpu*")) or any(bin_dir.glob("libggml-base.*")) else None


def check_dependencies(backend: str, args: tuple[str, ...]) -> None:
    """Refuse, in one line, a build whose backend's dependencies this machine lacks."""
    source = BACKEND_SOURCES[backend]
    missing = source.needs(args) if source.needs is not None else []
    if missing:
        raise BuildError(
            f"the {backend} build needs {'; '.join(missing)}: install them or name them with --cmake-arg "
            "(-DVulkan_GLSLC_EXECUTABLE=..., -DVulkan_INCLUDE_DIR=..., -DVulkan_LIBRARY=..., -DSPIRV-Headers_DIR=...)"
            if backend == "vulkan"
            else f"the {backend} build needs {'; '.join(missing)}: install them and retry"
        )


# llama-fit-params prints what llama.cpp's own ``--fit`` would choose (shown beside xover's planner).
# ggml-rpc-server (tools/rpc, built only with -DGGML_RPC=ON) exposes this host's devices to llama.cpp's RPC
# backend; with GGML_RPC on, llama-bench and llama-server also accept ``--rpc host:port,...``.
TARGETS = ("llama-bench", "llama-server", "llama-fit-params", "ggml-rpc-server")

# Parts of the tree the two targets never need (about 115 MB of the 176 MB).
_SKIP_DIRS = ("docs", "models", "media", "benches", ".devops", ".github")

_IK_BUILD_INFO = """# Written by xover: the ik-llama-cpp-python sdist leaves this script out, and common/CMakeLists.txt runs it to
# generate build-info.cpp. It takes the compiler and target from the tree's own cmake/build-info.cmake (git is
# absent from an unpacked sdist) and stamps the sdist's identity as the commit.
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/build-info.cmake")
set(BUILD_COMMIT "@IDENTITY@")
configure_file("${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp.in" "${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp")
"""


def _ik_fixups(tree: Path, identity: str) -> None:
    """What the ik_llama.cpp sdist leaves out that its build runs (``common/cmake/build-info-gen-cpp.cmake``)."""
    script = tree / "common" / "cmake" / "build-info-gen-cpp.cmake"
    if not script.exists():
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(_IK_BUILD_INFO.replace("@IDENTITY@", identity))


@dataclasses.dataclass(frozen=True)
class EngineSource:
    """How one engine is built. ``vendor``: the tree's folder inside the sdist; ``targets``: what is built (the
    first two, llama-bench and llama-server, must exist); ``cmake_base``: the engine's own -D arguments before the
    backend's; ``server_dir``: the folder that tells a local tree of this engine; ``tree_name``: the unpacked
    tree's folder prefix in the cache; ``fixups``: what the sdist leaves out, written into the unpacked tree."""

    engine: str
    pinned: PinnedSource
    vendor: str
    targets: tuple[str, ...]
    cmake_base: tuple[str, ...]
    server_dir: str  # e.g. "tools/server"
    tree_name: str
    stamps_commit: bool = True  # takes -DLLAMA_BUILD_COMMIT / -DLLAMA_BUILD_NUMBER
    fixups: Callable[[Path, str], None] | None = None


ENGINE_SOURCES: dict[str, EngineSource] = {
    "llama.cpp": EngineSource(
        engine="llama.cpp",
        pinned=PINNED,
        vendor="vendor/llama.cpp",
        targets=TARGETS,
        cmake_base=(
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_USE_PREBUILT_UI=OFF",  # otherwise the server build downloads its web UI
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DGGML_RPC=ON",  # the RPC backend (--rpc) and the ggml-rpc-server target
        ),
        server_dir="tools/server",
        tree_name="llama.cpp",
    ),
    # ik_llama.cpp keeps llama-bench and llama-server under examples/ (built with LLAMA_BUILD_EXAMPLES), and has
    # neither llama-fit-params nor the RPC server xover uses.
    "ik_llama.cpp": EngineSource(
        engine="ik_llama.cpp",
        pinned=IK_PINNED,
        vendor="vendor/ik_llama.cpp",
        targets=("llama-bench", "llama-server"),
        cmake_base=(
            "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_CURL=OFF",
        ),
        server_dir="examples/server",
        tree_name="ik_llama.cpp",
        stamps_commit=False,
        fixups=_ik_fixups,
    ),
}
"""Every engine xover builds, by the name a configuration gives (:data:`xover.domain.llama_options.ENGINES`)."""


def engine_source(engine: str) -> EngineSource:
    try:
        return ENGINE_SOURCES[engine]
    except KeyError:
        raise BuildError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINE_SOURCES)}") from None


@dataclasses.dataclass(frozen=True)
class SourceTree:
    root: Path
    commit: str  # full or short hash, an sdist's identity, or "unknown"
    build_number: int
    origin: str  # human description: "llama-cpp-python 0.3.36 (PyPI sdist)", a path, ...
    engine: str = "llama.cpp"


@dataclasses.dataclass(frozen=True)
class BuildManifest:
    key: str  # the build's folder name: <commit>-<backend>-<hash of its cmake arguments>
    backend: str
    commit: str
    build_number: int
    origin: str
    cmake_args: tuple[str, ...]
    bin_dir: str
    built_at: str
    build_seconds: float
    engine: str = "llama.cpp"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BuildManifest:
        data = json.loads(text)
        data["cmake_args"] = tuple(data["cmake_args"])
        return cls(**data)


def cmake_args_for(
    backend: str, extra: tuple[str, ...], commit: str, build_number: int, engine: str = "llama.cpp"
) -> tuple[str, ...]:
    """Every cmake -D argument of a build, in a stable order (they form part of the cache key)."""
    if backend not in BACKEND_SOURCES:
        raise BuildError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    eng = engine_source(engine)
    base = list(eng.cmake_base)
    if eng.stamps_commit:
        base += [
            f"-DLLAMA_BUILD_COMMIT={commit[:7] if commit != 'unknown' else 'unknown'}",
            f"-DLLAMA_BUILD_NUMBER={build_number}",
        ]
    source = BACKEND_SOURCES[backend]
    found = source.args(tuple(extra)) if source.args is not None else ()
    return tuple(base + list(source.cmake) + _cpu_isa_args(backend) + list(found) + list(extra))


# ggml's CPU build is native (-march=native), which compiles its AMX matmul path wherever the CPU advertises AMX.
# Some virtual machines advertise AMX but trap its instructions (SIGILL at the first `tilezero`, seen on a
# Firecracker VM with a Sapphire-Rapids-class Xeon even though the kernel granted the tile-data permission), so
# llama-bench dies on every model. The CPU-only build leaves AMX out; GPU builds keep llama.cpp's default flags.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _cpu_isa_args(backend: str) -> list[str]:
    if backend != "cpu" or platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    return [f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"]


def build_key(commit: str, backend: str, args: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\n".join(args).encode()).hexdigest()[:8]
    return f"{commit[:7]}-{backend}-{digest}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def download_pinned(root: Path, log: Callable[[str], None], pinned: PinnedSource = PINNED) -> Path:
    """The pinned sdist, fetched with pip from the configured index and checked against its hash."""
    PINNED = pinned  # noqa: N806 - the engine's pin
    target = root / "downloads" / PINNED.filename
    if target.exists() and _sha256(target) == PINNED.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading {PINNED.package}=={PINNED.version} (sdist, vendors its engine's tree) with pip")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"{PINNED.package}=={PINNED.version}",
        "-d",
        str(target.parent),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not target.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(
            f"could not download {PINNED.package}=={PINNED.version} from the package index ({tail[0]}); "
            "on a machine without registry access pass --source PATH (the sdist or an unpacked source tree)"
        )
    got = _sha256(target)
    if got != PINNED.sha256:
        target.unlink()
        raise BuildError(f"{PINNED.filename} has sha256 {got}, expected {PINNED.sha256}: refusing to build it")
    return target


def _sdist_commit(tar: tarfile.TarFile, prefix: str) -> str:
    try:
        member = tar.extractfile(f"{prefix}.git/modules/vendor/llama.cpp/HEAD")
    except KeyError:
        return "unknown"
    if member is None:
        return "unknown"
    head = member.read().decode().strip()
    return head if re.fullmatch(r"[0-9a-f]{40}", head) else "unknown"


def unpack_sdist(sdist: Path, root: Path, engine: str = "llama.cpp") -> SourceTree:
    """Unpack the vendored tree of an engine's sdist into the cache (once per identity)."""
    eng = engine_source(engine)
    try:
        tar = tarfile.open(sdist, "r:gz")
    except (OSError, tarfile.TarError) as e:
        raise BuildError(f"{sdist} is not a readable .tar.gz sdist ({e})") from None
    with tar:
        names = tar.getnames()
        top = names[0].split("/")[0] + "/" if names else ""
        vendor = f"{top}{eng.vendor}/"
        if f"{vendor}CMakeLists.txt" not in names:
            raise BuildError(f"{sdist} does not vendor {engine} (no {eng.vendor}/CMakeLists.txt)")
        commit = _sdist_commit(tar, top) if eng.pinned.commit else "unknown"
        if commit == "unknown" and not eng.pinned.commit and _sha256(sdist) == eng.pinned.sha256:
            commit = eng.pinned.identity  # an sdist that records no commit: its pinned identity
        build_number = eng.pinned.build_number if commit == eng.pinned.commit else 0
        ident = commit[:7] if commit != "unknown" else _sha256(sdist)[:7]
        if not eng.pinned.commit and commit == eng.pinned.identity:
            ident = commit
        dest = root / "src" / f"{eng.tree_name}-{ident}"
        with _locked(root / "src" / ".lock"):
            if not (dest / ".complete").exists():
                shutil.rmtree(dest, ignore_errors=True)
                tmp = dest.with_name(dest.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                members = []
                for m in tar.getmembers():
                    if not m.name.startswith(vendor):
                        continue
                    rel = m.name[len(vendor) :]
                    if not rel or rel.split("/")[0] in _SKIP_DIRS or rel == ".git":
                        continue
                    m.name = rel
                    members.append(m)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, members=members, filter="data")  # noqa: S202 - filtered above
                else:  # pragma: no cover - Python without extraction filters
                    tar.extractall(tmp, members=members)  # noqa: S202 - filtered above
                if eng.fixups is not None:
                    eng.fixups(tmp, ident)
                tmp.rename(dest)
                (dest / ".complete").write_text(commit + "\n")
    origin = f"{sdist.name}"
    return SourceTree(root=dest, commit=commit, build_number=build_number, origin=origin, engine=engine)


def _git_commit(tree: Path) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", out) else "unknown"


def resolve_source(
    source: Path | None, root: Path, log: Callable[[str], None], engine: str = "llama.cpp"
) -> SourceTree:
    """The engine's tree to build: its pinned registry sdist, or what ``--source`` names."""
    eng = engine_source(engine)
    if source is None:
        tree = unpack_sdist(download_pinned(root, log, eng.pinned), root, engine)
        return dataclasses.replace(tree, origin=f"{eng.pinned.package} {eng.pinned.version} sdist (package registry)")
    source = source.expanduser()
    if not source.exists():
        raise BuildError(f"--source {source} does not exist: pass an sdist .tar.gz or an unpacked {engine} tree")
    if source.is_file():
        return unpack_sdist(source.resolve(), root, engine)
    for candidate in (source, source / eng.vendor):
        if (candidate / "CMakeLists.txt").exists() and (candidate / eng.server_dir).is_dir():
            commit = _git_commit(candidate)
            stamp = candidate / "XOVER_COMMIT"  # written by whoever copied a tree without .git
            if commit == "unknown" and stamp.exists():
                commit = stamp.read_text().strip() or "unknown"
            number = eng.pinned.build_number if commit == eng.pinned.commit else 0
            if eng.fixups is not None:
                eng.fixups(candidate, commit[:7] if commit != "unknown" else "unknown")
            return SourceTree(
                root=candidate.resolve(), commit=commit, build_number=number, origin=str(candidate), engine=engine
            )
    raise BuildError(f"--source {source} is not a {engine} tree (no CMakeLists.txt and {eng.server_dir})")


def _ninja() -> str | None:
    beside = Path(sys.executable).parent / "ninja"
    if beside.exists():
        return str(beside)
    return shutil.which("ninja")


def find_manifest(key: str, root: Path | None = None) -> BuildManifest | None:
    path = (root or cache_root()) / "builds" / key / "manifest.json"
    if not path.exists():
        return None
    manifest = BuildManifest.from_json(path.read_text())
    eng = ENGINE_SOURCES.get(manifest.engine)
    if eng is not None and all((Path(manifest.bin_dir) / t).exists() for t in eng.targets):
        return manifest
    return None


def cached_builds(root: Path | None = None, engine: str | None = "llama.cpp") -> list[BuildManifest]:
    """Every complete cached build of ``engine`` (None: of every engine), newest first."""
    builds = (root or cache_root()) / "builds"
    found = []
    for path in sorted(builds.glob("*/manifest.json")) if builds.exists() else []:
        m = find_manifest(path.parent.name, root)
        if m is not None and (engine is None or m.engine == engine):
            found.append(m)
    return sorted(found, key=lambda m: m.built_at, reverse=True)


def build(
    backend: str = "cpu",
    extra_cmake_args: tuple[str, ...] = (),
    source: Path | None = None,
    jobs: int | None = None,
    log: Callable[[str], None] = lambda s: None,
    on_progress: Callable[[int, int], None] | None = None,
    engine: str = "llama.cpp",
) -> BuildManifest:
    """Build (or find in the cache) an engine's llama-bench and llama-server for a backend."""
    root = cache_root()
    eng = engine_source(engine)
    pin = eng.pinned
    # Fast path: the pinned source with these arguments is already built.
    if source is None:
        args = cmake_args_for(backend, extra_cmake_args, pin.commit or pin.identity, pin.build_number, engine)
        hit = find_manifest(build_key(pin.commit or pin.identity, backend, args), root)
        if hit is not None:
            return hit
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not on PATH: install it (apt-get install cmake) and retry")
    check_dependencies(backend, cmake_args_for(backend, extra_cmake_args, "unknown", 0, engine))
    tree = resolve_source(source, root, log, engine)
    args = cmake_args_for(backend, extra_cmake_args, tree.commit, tree.build_number, engine)
    commit_for_key = tree.commit if tree.commit != "unknown" else hashlib.sha256(str(tree.root).encode()).hexdigest()
    key = build_key(commit_for_key, backend, args)
    workdir = root / "builds" / key
    with _locked(workdir / ".lock"):
        hit = find_manifest(key, root)
        if hit is not None:
            return hit
        build_dir = workdir / "build"
        log_path = workdir / "build.log"
        generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_ninja()}"] if _ninja() else ["-G", "Unix Makefiles"]
        configure = ["cmake", "-S", str(tree.root), "-B", str(build_dir), *generator, *args]
        targets = eng.targets
        compile_ = ["cmake", "--build", str(build_dir), "--target", *targets, "-j", str(jobs or os.cpu_count() or 2)]
        start = time.monotonic()
        log(f"building {engine}'s {', '.join(targets)} ({backend}) from {tree.origin}; log: {log_path}")
        with log_path.open("w", buffering=1) as logf:
            for cmd in (configure, compile_):
                logf.write("$ " + " ".join(cmd) + "\n")
                logf.flush()
                _run_logged(cmd, logf, on_progress, BACKEND_SOURCES[backend].env)
        bin_dir = build_dir / "bin"
        missing = [t for t in targets if not (bin_dir / t).exists()]
        if missing:
            raise BuildError(f"build finished without {', '.join(missing)}; see {log_path}")
        manifest = BuildManifest(
            key=key,
            backend=backend,
            commit=tree.commit,
            build_number=tree.build_number,
            origin=tree.origin,
            cmake_args=args,
            bin_dir=str(bin_dir),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            build_seconds=round(time.monotonic() - start, 1),
            engine=engine,
        )
        (workdir / "manifest.json").write_text(manifest.to_json())
        return manifest


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PCT = re.compile(r"^\[\s*(\d+)%\]")


def _run_logged(
    cmd: list[str],
    logf,
    on_progress: Callable[[int, int], None] | None,
    env: Callable[[], dict[str, str]] | None = None,
) -> None:
    extra = env() if env is not None else {}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env={**os.environ, **extra}
    )
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            tail = (tail + [line.rstrip()])[-15:]
            if on_progress is not None:
                m = _NINJA_STEP.match(line)
                if m:
                    on_progress(int(m.group(1)), int(m.group(2)))
                else:
                    m = _MAKE_PCT.match(line)
                    if m:
                        on_progress(int(m.group(1)), 100)
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if rc != 0:
        errors = [t for t in tail if "error" in t.lower()] or tail[-1:]
        raise BuildError(f"{cmd[0]} {cmd[1]} failed (exit {rc}): {errors[-1] if errors else ''}; full log: {logf.name}")
