"""Study specs: the shipped example parses, configs translate to both binaries, bad specs say what to fix."""

from pathlib import Path

import pytest

from xover.domain.config import LlamaConfig
from xover.domain.prompts import parse_lengths
from xover.domain.study_spec import config_from_table, load_spec, spec_from_dict
from xover.errors import XoverError

EXAMPLE = Path(__file__).parents[2] / "examples" / "seed-qwen3-coder-30b.toml"


def test_shipped_example_reproduces_the_seed():
    spec = load_spec(EXAMPLE)
    assert spec.model_preset == "qwen3-30b-a3b"
    assert spec.lengths == (1024, 4096, 16384, 32768)
    assert spec.response_tokens == (200,)
    assert [c.name for c in spec.configs] == ["ncmoe=12", "ncmoe=18"]
    assert spec.configs[1].get("n-cpu-moe") == "18" and spec.configs[1].n_cpu_moe == 18


def test_config_translates_to_both_binaries():
    c = LlamaConfig(
        name="x",
        settings=(
            ("n-cpu-moe", "18"),
            ("ubatch-size", "2048"),
            ("flash-attn", "on"),
            ("no-op-offload", "1"),
            ("GGML_OP_OFFLOAD_MIN_BATCH", "64"),
        ),
        server_args=("--mlock",),
    )
    assert c.bench_argv() == ("-ncmoe", "18", "-ub", "2048", "-nopo", "1", "-fa", "on")
    assert c.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),) and c.label == "x"
    assert c.server_argv() == ("-ncmoe", "18", "-ub", "2048", "--no-op-offload", "-fa", "on", "--mlock")
    assert c.llama_server_command() == "-ncmoe 18 -ub 2048 --no-op-offload -fa on --mlock"
    # the spec's [[config]] table says the same with the option table's names
    table = {
        "name": "x",
        "n-cpu-moe": 18,
        "ubatch-size": 2048,
        "flash-attn": "on",
        "no-op-offload": True,
        "env": {"GGML_OP_OFFLOAD_MIN_BATCH": "64"},
        "server-args": ["--mlock"],
    }
    assert config_from_table(table, 0) == c


def test_lengths_accept_k_suffix():
    assert parse_lengths("32k,1k,4096") == (1024, 4096, 32768)
    with pytest.raises(XoverError, match="at least 1 token"):
        parse_lengths("0,1k")
    with pytest.raises(XoverError, match="not a number of tokens"):
        parse_lengths("-5")
    with pytest.raises(XoverError, match="repeats a length"):
        parse_lengths("1k,1024")


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"model": {"preset": "tiny-moe"}}, "at least one configuration"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
        ({"config": [{"name": "a"}]}, "exactly one of"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a", "n-cpu-moe": -1}]}, "non-negative integer"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a", "flash-attn": "yes"}]}, "one of on, off, auto"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a", "ncmoe": 3}]}, "unknown key 'ncmoe'"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"lengths": [0]}}, "at least 1 token"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"skip": ["nap"]}}, "unknown stage"),
        ({"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "studdy": {}}, "unknown section"),
        ({"model": {"preset": "tiny-moe"}, "config": [{}]}, "give it a name"),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"bench-depths": 4096}},
            "non-empty list",
        ),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"bench-depths": ["x"]}},
            "bench-depths",
        ),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"hardware": "h300"}},
            "unknown hardware",
        ),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"cached-turns": ["2k", "2048"]}},
            "cached-turns must be distinct positive token counts",
        ),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"cached-turns": ["lots"]}},
            "cached-turns 'lots' is not a number of tokens",
        ),
        (
            {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"cached-depth": 0}},
            "cached-depth must be a positive token count",
        ),
    ],
)
def test_bad_specs_are_one_line_errors(doc, message):
    with pytest.raises(XoverError, match=message) as e:
        spec_from_dict(doc)
    assert "\n" not in str(e.value)


def test_bench_depths_default_to_the_lengths():
    doc = {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"lengths": ["1k", "32k"]}}
    assert spec_from_dict(doc).bench_depths is None
    doc["study"]["bench-depths"] = [0, "4k"]
    assert spec_from_dict(doc).bench_depths == (0, 4096)


def test_malformed_toml(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("[model\npreset = 1")
    with pytest.raises(XoverError, match="not valid TOML"):
        load_spec(p)
    with pytest.raises(XoverError, match="cannot read"):
        load_spec(tmp_path / "missing.toml")


def test_gpu_default_uses_the_placement_planner():
    from xover.analysis.default_study import gpu_default_spec

    # a 24 GiB card: 8K fits with fewer experts on the CPU than 32K forces
    spec = gpu_default_spec(24 << 30)
    n = [c.n_cpu_moe for c in spec.configs]
    assert spec.model_preset == "qwen3-30b-a3b" and n[0] <= n[1]
    # a card that holds everything: 0 against what a 24 GiB card needs at 32K
    big = gpu_default_spec(140 << 30)
    nb = [c.n_cpu_moe for c in big.configs]
    assert nb[0] == 0 and nb[1] == n[1] > 0
    with pytest.raises(XoverError, match="does not fit"):
        gpu_default_spec(1 << 30)


def test_study_cli_narrows_one_invocation():
    from xover.cli.study import narrow

    spec = load_spec(EXAMPLE)
    n = narrow(spec, "cache, session", "ncmoe=18")
    assert [c.name for c in n.configs] == ["ncmoe=18"] and {"cache", "session"} <= n.skip
    assert narrow(spec, "", "") == spec
    with pytest.raises(XoverError, match="--skip 'ttfb' is not a stage"):
        narrow(spec, "ttfb", "")
    with pytest.raises(XoverError, match="--configs 'ncmoe=24' is not in the spec: use some of ncmoe=12, ncmoe=18"):
        narrow(spec, "", "ncmoe=24")


def test_cached_turns_are_given_or_taken_around_the_replayed_session() -> None:
    """cached-turns lists new tokens per turn; "session" takes them around the session's turn (a quarter of it, it,
    four times it), on the session's last cached context unless cached-depth says otherwise; a configuration
    placed for a shorter context measures only the turns it holds."""
    from xover.domain.config import LlamaConfig

    doc = {"model": {"preset": "tiny-moe"}, "config": [{"name": "a"}], "study": {"lengths": ["1k", "16k"]}}
    assert spec_from_dict(doc).turns_depth is None and spec_from_dict(doc).cached_new_tokens == ()
    doc["study"].update({"cached-turns": "session", "session-turns": 12})
    spec = spec_from_dict(doc)
    # system 4K (a quarter of 16K), final size 16K: 12 turns of 1,024 tokens; the last cached context 15K
    assert spec.session_step == 1024 and spec.cached_new_tokens == (256, 1024, 4096) and spec.turns_depth == 15360
    assert spec.longest_context_need == 15360 + 4096
    doc["study"].update({"cached-turns": ["512", "8k"], "cached-depth": "16k"})
    spec = spec_from_dict(doc)
    assert spec.cached_new_tokens == (512, 8192) and spec.turns_depth == 16384
    assert spec.cached_turns_for(LlamaConfig("short", max_context=20_000)) == (512,)
