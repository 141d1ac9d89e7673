"""The default study on a GPU machine, where the user gives no spec: its two offload levels chosen by the placement
planner for the GPU's free memory. Pure."""

from __future__ import annotations

from xover.analysis.theory import model_terms, plan_placement
from xover.domain.config import LlamaConfig
from xover.domain.presets import preset as get_preset
from xover.domain.shapes import tensor_table
from xover.domain.study_spec import StudySpec
from xover.errors import XoverError

# A typical local GPU, for a default study on a card so large that nothing needs offloading.
CONSUMER_VRAM_BYTES = 24 << 30


def gpu_default_spec(free_vram_bytes: int, preset: str = "qwen3-30b-a3b") -> StudySpec:
    """The default study on a GPU machine: the seed's question with offload levels chosen by the
    placement planner for this GPU's free memory: the smallest ``--n-cpu-moe`` that fits an 8K
    context against the one a 32K context forces. When both are the same (a card big enough for
    everything), the second level is what a 24 GiB card would need at 32K, so the study still
    measures a real offload penalty."""
    terms = model_terms(tensor_table(get_preset(preset)))
    short, long_ = (p.n_cpu_moe for p in plan_placement(terms, free_vram_bytes, (8192, 32768 + 512)))
    if short is None or long_ is None:
        raise XoverError(
            f"{preset} does not fit this GPU's {free_vram_bytes / 2**30:.1f} GiB free even with every "
            "expert on the CPU: write a spec with a smaller model (examples/*.toml)"
        )
    if short == long_:
        (alt,) = (p.n_cpu_moe for p in plan_placement(terms, min(free_vram_bytes, CONSUMER_VRAM_BYTES), (32768 + 512,)))
        long_ = alt if alt is not None and alt != short else short + max(1, terms.n_layer // 4)
    return StudySpec(
        configs=tuple(
            LlamaConfig(name=f"ncmoe={n}", settings=(("n-cpu-moe", str(n)), ("n-gpu-layers", "99")))
            for n in (short, long_)
        ),
        model_preset=preset,
        lengths=(1024, 4096, 16384, 32768),
        response_tokens=(200,),
        repetitions=1,
        rounds=3,
        bench_repetitions=3,
    )
