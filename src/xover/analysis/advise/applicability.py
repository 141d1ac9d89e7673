"""Which tuning knobs can act on a configuration on this machine, and the one-line reason a knob is skipped. Pure.

The tuning stage searches only what can change something here; each skip is reported, so that a knob missing from
the search is never a silent gap.

* **GPU-only knobs** (pinned host memory, op offload and its threshold, ``--no-host``) change how weights reach a
  GPU: a CPU-only build has nothing to copy.
* **Where the CPU-resident experts live.** With a GPU present, llama.cpp puts weights overridden to the CPU into the
  GPU's host buffer (``CUDA_Host``, or the mapped file), ahead of the CPU's repacked buffer (``CPU_REPACK``).
  ``--no-host`` skips that buffer, so experts the CPU can repack are repacked for its vector kernels (decode), and
  are then no longer copied to the GPU for prompt batches (prefill). It is searched only where some CPU-resident
  expert tensor has a repacked kernel on this CPU's instruction set (:data:`REPACK_KERNELS`). AMX kernels take
  ``MUL_MAT`` only, never the experts' ``MUL_MAT_ID``, so they never hold experts.
* **``--no-repack``** changes a buffer only where something is repacked: on a CPU-only build, CPU-resident experts
  with a kernel here; with a GPU, nothing unless ``--no-host`` is given (that pair is searched as ``--no-host``).
* **``-b`` alone** (:func:`batch_reason`) cannot change the ubatches llama.cpp runs while ``-ub`` is at most the
  default ``-b``: only a ``-b`` below the ubatch would.
* **KV cache types** (``-ctk``/``-ctv q8_0``) are searched only for a configuration placed under a VRAM budget: the
  memory a smaller cache frees keeps more experts on the GPU. Elsewhere they would trade quality, which xover does
  not measure, for little speed.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from xover.domain import llama_options as opts
from xover.domain.shapes import TensorInfo

# (CPU flags that must all be present as /proc/cpuinfo names them, ggml types, rows the tensor's ne[1] must be a
# multiple of): ggml-cpu's repack.cpp (ggml_repack_get_optimal_repack_type) at the pinned llama.cpp commit.
REPACK_KERNELS: tuple[tuple[frozenset[str], frozenset[str], int], ...] = (
    (frozenset({"avx2"}), frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}), 8),
    (frozenset({"avx512f"}), frozenset({"Q2_K"}), 8),
    (frozenset({"asimd", "i8mm"}), frozenset({"Q4_0", "Q8_0"}), 4),
    (frozenset({"asimd", "i8mm"}), frozenset({"Q4_K", "Q5_K", "Q6_K"}), 8),
    (frozenset({"asimd", "asimddp"}), frozenset({"Q4_0", "IQ4_NL", "MXFP4", "Q8_0"}), 4),
    (frozenset({"asimd", "asimddp"}), frozenset({"Q4_K", "Q5_K", "Q6_K"}), 8),
)


def repacks(ggml_type: str, rows: int, cpu_flags: frozenset[str]) -> bool:
    """Whether llama.cpp repacks a tensor of this type and ``ne[1]`` on a CPU with these flags."""
    return any(
        need <= cpu_flags and ggml_type.upper() in types and rows % multiple == 0
        for need, types, multiple in REPACK_KERNELS
    )


@dataclasses.dataclass(frozen=True)
class Context:
    """What decides whether a knob can act: the build, the CPU's flags (empty: not known, so nothing is skipped on
    their account) and the expert tensors a configuration keeps on the CPU, as (ggml type, ne[1])."""

    gpu_build: bool
    cpu_flags: frozenset[str] = frozenset()
    cpu_experts: tuple[tuple[str, int], ...] = ()
    budget: bool = False  # placed under a VRAM budget (a fit configuration): memory knobs move its experts
    backend: str | None = None  # the build's backend (cpu, cuda, vulkan...); None: not known

    @property
    def repacked_types(self) -> tuple[str, ...]:
        """The CPU-resident experts' types this CPU repacks."""
        return tuple(dict.fromkeys(t for t, rows in self.cpu_experts if repacks(t, rows, self.cpu_flags)))

    @property
    def expert_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for t, _ in self.cpu_experts))


def cpu_experts(
    tensors: Iterable[TensorInfo], n_cpu_moe: int | None, overrides: Sequence[str], gpu_build: bool
) -> tuple[tuple[str, int], ...]:
    """The expert tensors that stay on the CPU, as (ggml type, ne[1]): every one on a CPU-only build; with a GPU,
    those of the first ``n_cpu_moe`` layers and those an ``-ot <regex>=CPU`` override names. ``n_cpu_moe`` None:
    the placement is not known yet (a fit level), so every expert counts as possibly on the CPU."""
    to_cpu = [re.compile(o.rsplit("=", 1)[0]) for o in overrides if o.rsplit("=", 1)[-1].upper().startswith("CPU")]
    out = []
    for t in tensors:
        if not t.is_expert or len(t.ne) < 2:
            continue
        layer = t.layer
        on_cpu = (
            not gpu_build
            or n_cpu_moe is None
            or (layer is not None and layer < n_cpu_moe)
            or any(p.search(t.name) for p in to_cpu)
        )
        if on_cpu:
            out.append((t.ggml_type, t.ne[1]))
    return tuple(out)


def backend_reason(name: str, backend: str | None) -> str | None:
    """Why the option ``name`` cannot act on a build for ``backend`` (one line), or None: a knob of another backend
    (``--no-host`` on Metal, a ``GGML_VK_*`` variable on CUDA) is never searched there, whatever the spec asks."""
    option = opts.BY_NAME.get(name)
    if option is None or backend is None or option.acts_on(backend):
        return None
    where = option.backends or opts.GPU_BACKENDS
    return f"it acts only on {', '.join(where)} builds, not {backend}"


def skip_reason(name: str, ctx: Context) -> str | None:
    """Why the option ``name`` cannot change anything for this configuration here (one line), or None to search it."""
    option = opts.BY_NAME.get(name)
    if ctx.backend not in (None, "cpu") and (why := backend_reason(name, ctx.backend)) is not None:
        return why
    if option is not None and option.gpu_only and not ctx.gpu_build:
        return "a CPU-only build copies no weights to a GPU"
    if option is not None and option.budget_only and not ctx.budget:
        return (
            "searched only under a VRAM budget (n-cpu-moe = 'fit'), where the memory a smaller cache frees keeps "
            "experts on the GPU; its quality cost is not measured"
        )
    if name == opts.NO_HOST.name:
        if not ctx.cpu_experts:
            return "no experts stay on the CPU in this configuration"
        if ctx.cpu_flags and not ctx.repacked_types:
            return (
                f"the CPU-resident experts ({', '.join(ctx.expert_types)}) have no repacked kernel on this CPU, so "
                "--no-host would repack nothing"
            )
    if name == opts.REPACK.name:
        if ctx.gpu_build:
            return (
                "with a GPU, CPU-resident experts sit in the GPU's host buffer and are not repacked unless --no-host "
                "is given (searched as --no-host)"
            )
        if not ctx.cpu_experts:
            return "no experts stay on the CPU in this configuration"
        if ctx.cpu_flags and not ctx.repacked_types:
            return f"the experts ({', '.join(ctx.expert_types)}) have no repacked kernel on this CPU: nothing to switch"
    return None


def batch_reason(candidates: Sequence[str], ubatch: int, batch: int = int(opts.BATCH_SIZE.default)) -> str | None:
    """Why ``-b`` alone, at these candidate values, cannot change anything for a configuration that runs ``-ub
    ubatch`` and ``-b batch`` (one line), or None. llama.cpp runs ubatches of
    ``min(-ub, -b)``: while the ubatch is at most the configuration's logical batch and no candidate is below it,
    every candidate runs the same ubatches, only in fewer ``llama_decode`` calls (the ubatch knob raises ``-b`` with
    ``-ub`` where it must). A configuration whose own ``-b`` is below its ubatch runs ``-b``-token ubatches, which a
    larger ``-b`` alone would raise."""
    if ubatch <= batch and candidates and all(int(v) >= ubatch for v in candidates):
        return (
            f"llama.cpp runs ubatches of min(-ub, -b): with -ub {ubatch} a larger -b alone runs the same {ubatch}-token "
            "ubatches (the ubatch knob raises -b with it)"
        )
    return None


def ubatch_reason(candidates: Sequence[str], longest: int, current: int) -> tuple[tuple[str, ...], str | None]:
    """The ``-ub`` candidates that can act on a study whose requests prefill at most ``longest`` tokens, and why the
    others cannot (one line), or None. A prompt of L tokens runs as ubatches of ``min(-ub, L)`` tokens, so every
    ubatch of at least ``longest`` runs each of the study's prompts as one ubatch, the same work (only its compute
    buffer is larger): of those, only the smallest is kept, and none where the configuration's own ubatch
    ``current`` (``min(-ub, -b)``, llama.cpp's default 512 where it sets neither) is one."""
    at_least = sorted((v for v in dict.fromkeys(candidates) if int(v) >= longest), key=int)
    same = at_least if current >= longest else at_least[1:]
    if not same:
        return tuple(candidates), None
    kept = tuple(v for v in candidates if v not in same)
    as_ = f"the configuration's own {current}-token ubatch" if current >= longest else f"-ub {at_least[0]}"
    return kept, (
        f"every request of this study prefills at most {longest:,} tokens, one ubatch at {as_}: "
        f"-ub {', '.join(same)} would run the same ubatches"
    )


def split(names: Sequence[str], ctx: Context) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The options among ``names`` to search here, and the skipped ones with their reasons, in ``names``' order."""
    keep, skipped = [], []
    for name in names:
        why = skip_reason(name, ctx)
        if why is None:
            keep.append(name)
        else:
            skipped.append((name, why))
    return tuple(keep), tuple(skipped)
