"""Known records for the tests that store or read them: one provenance, varied only where a test needs it."""

from __future__ import annotations

from xover.domain.records import ModelId, Provenance


def provenance(
    model: str = "m.gguf",
    *,
    backend: str = "CPU",
    cpu: str = "cpu",
    gpu: str | None = None,
    header_sha256: str = "ab" * 32,
    extra: tuple[tuple[str, str], ...] = (),
) -> Provenance:
    """A run's provenance: build 0c1e570 from the cache, on host ``h``, with MODEL (a 10-byte file at ``/MODEL``)."""
    return Provenance(
        llama_build_commit="0c1e570",
        llama_build_number=0,
        llama_backend=backend,
        llama_bin_dir="/x",
        llama_bin_source="cache",
        cpu_info=cpu,
        gpu_info=gpu,
        hostname="h",
        os="Linux",
        xover_version="0.1.0",
        model=ModelId(path=f"/{model}", name=model, size_bytes=10, header_sha256=header_sha256),
        extra=extra,
    )
