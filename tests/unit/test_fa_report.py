"""Flash attention on vs off, paired by what llama-bench reports it ran."""

from xover.domain.records import BenchResult
from xover.report.fa import fa_findings, fa_mode, fa_table, fa_tests

BASE = {"model_filename": "m.gguf", "n_cpu_moe": 12, "n_ubatch": 512, "type_k": "f16", "backends": "CUDA"}


def result(key: str, fa: int, n_prompt: int, n_gen: int, depth: int, tps: float, **over: object) -> BenchResult:
    record = {**BASE, **over, "flash_attn": fa}
    return BenchResult(key, n_prompt, n_gen, depth, (1,), (tps,), tps, tps / 100, record)


def bench() -> list[tuple[str, BenchResult]]:
    out = []
    for depth, (pp_on, pp_off, tg_on, tg_off) in {
        1024: (1000.0, 980.0, 50.0, 49.0),
        32768: (800.0, 400.0, 40.0, 39.0),
    }.items():
        out += [
            ("x", result("kon", 1, 512, 0, depth, pp_on)),
            ("y", result("koff", 0, 512, 0, depth, pp_off)),
            ("x", result("kon", 1, 0, 128, depth, tg_on)),
            ("y", result("koff", 0, 0, 128, depth, tg_off)),
        ]
    # another offload level measured with fa on only: nothing to pair
    out.append(("fa18", result("k18", 1, 512, 0, 1024, 500.0, n_cpu_moe=18)))
    return out


def test_modes_pair_only_when_everything_else_is_equal() -> None:
    assert [fa_mode(v) for v in (-1, 0, 1, True, "on")] == ["auto", "off", "on", "on", "on"]
    tests = fa_tests(bench())
    assert len(tests) == 4 and all(t.labels == "x (fa on) / y (fa off)" for t in tests)
    pp = [t for t in tests if t.kind == "pp"]
    assert [round(t.ratio or 0, 3) for t in pp] == [round(1000 / 980, 3), 2.0]
    header, rows = fa_table(tests)
    assert header == ["configurations", "test", "t/s fa on", "t/s fa off", "on/off"]
    assert rows[0][1:] == ["pp512 @ d1024", "1000.00 ± 10.00", "980.00 ± 9.80", "1.02x"]


def test_findings_say_whether_the_shape_changes_and_what_memory_each_mode_took() -> None:
    memory = {
        "kon": {"buffers": [["CUDA0", "KV", 3 << 30], ["CUDA0", "compute", 300 << 20]]},
        "koff": {"buffers": [["CUDA0", "KV", 3 << 30], ["CUDA0", "compute", 2 << 30]]},
    }
    lines = fa_findings(fa_tests(bench()), memory)
    assert (
        "prefill on/off 1.02x at depth 1,024 and 2.00x at 32,768: flash attention changes the shape of the curve: "
        "its advantage grows with depth" in lines[0]
    )
    assert (
        "decode on/off 1.02x at depth 1,024 and 1.03x at 32,768: flash attention shifts the curve without "
        "changing its shape" in lines[1]
    )
    assert any("fa off allocated KV 3,072 MiB and compute buffers 2,048 MiB" in line for line in lines)
    assert any("fa on allocated KV 3,072 MiB and compute buffers 300 MiB" in line for line in lines)


def test_no_section_without_a_pair() -> None:
    assert (
        fa_tests([("a", result("k", 1, 512, 0, 0, 10.0)), ("b", result("k2", 1, 512, 0, 0, 11.0, n_ubatch=1024))]) == []
    )


def test_a_change_within_the_spread_is_not_called_a_change_of_shape() -> None:
    noisy = [
        ("on", BenchResult("a", 512, 0, d, (1,), (x,), x, sd, {**BASE, "flash_attn": 1}))
        for d, x, sd in ((0, 1000.0, 150.0), (4096, 1000.0, 150.0))
    ]
    noisy += [
        ("off", BenchResult("b", 512, 0, d, (1,), (x,), x, sd, {**BASE, "flash_attn": 0}))
        for d, x, sd in ((0, 850.0, 5.0), (4096, 1000.0, 5.0))
    ]
    (line,) = fa_findings(fa_tests(noisy))
    assert "1.18x at depth 0 and 1.00x at 4,096" in line
    assert "shifts the curve without changing its shape (the -15% change with depth is within noise, ±42%)" in line
