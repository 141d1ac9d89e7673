"""A user's own llama-server command line, read through the option table (issue 67's first part): command lines as
llama.cpp's README and server docs write them parse, print back in the table's spellings and read again the same;
unknown flags pass through verbatim; a bad one is refused in one line that names it."""

from __future__ import annotations

import shlex

import pytest

from xover.domain.command_line import listed, parse_command, split_command
from xover.errors import XoverError

DOCS = [
    # llama.cpp's README and tools/server/README.md, and the issue's forum-style command
    "llama-server -m model.gguf --port 8080",
    "llama-server -m models/7B/ggml-model.gguf -c 2048",
    "llama-server -m model.gguf -ngl 99 --n-cpu-moe 20 -c 32768 -ub 2048",
    'llama-server -m gpt-oss-120b.gguf -ngl 99 -ot ".ffn_.*_exps.=CPU" -fa on --jinja -c 0',
    "./build/bin/llama-server --model=m.gguf --ctx-size=8192 --n-gpu-layers=99 --ubatch-size=1024 --threads 8",
    r'llama-server -m q.gguf -ot "blk\.(1[0-9])\.ffn_.*_exps\.=CPU" -ot "blk\.(2[0-9])\.ffn_.*=CUDA0" --no-mmap',
    "llama-server -m m.gguf -np 4 --cache-ram 8192 --host 0.0.0.0 --log-file s.log --temp 0.6 --top-k 20",
]


@pytest.mark.parametrize("text", DOCS)
def test_a_documented_command_prints_back_and_reads_again_the_same(text: str) -> None:
    cmd = parse_command(text)
    again = parse_command(cmd.text())
    assert again == cmd
    assert again.argv() == cmd.argv()


def test_what_the_table_knows_becomes_settings_and_the_rest_passes_through_verbatim() -> None:
    cmd = parse_command(DOCS[2])
    assert cmd.binary == "llama-server" and cmd.model == "model.gguf" and cmd.ctx_size == 32768
    assert dict(cmd.settings) == {"n-cpu-moe": "20", "n-gpu-layers": "99", "ubatch-size": "2048"}
    assert cmd.passthrough == () and cmd.config().name == "yours"
    assert cmd.argv() == tuple(shlex.split("llama-server -m model.gguf -c 32768 -ncmoe 20 -ngl 99 -ub 2048"))
    jinja = parse_command(DOCS[3])
    assert dict(jinja.settings)["override-tensor"] == ".ffn_.*_exps.=CPU" and dict(jinja.settings)["flash-attn"] == "on"
    assert jinja.passthrough == ("--jinja",) and jinja.ctx_size == 0
    # --flag=value is --flag value; the binary's path is kept
    eq = parse_command(DOCS[4])
    assert eq.binary == "./build/bin/llama-server" and eq.model == "m.gguf" and eq.ctx_size == 8192
    assert dict(eq.settings) == {"n-gpu-layers": "99", "ubatch-size": "1024", "threads": "8"}


def test_a_list_option_given_again_adds_to_its_list_and_quoted_regexes_stay_whole() -> None:
    cmd = parse_command(DOCS[5])
    assert dict(cmd.settings)["override-tensor"] == r"blk\.(1[0-9])\.ffn_.*_exps\.=CPU,blk\.(2[0-9])\.ffn_.*=CUDA0"
    assert cmd.passthrough == ("--no-mmap",)  # not in the table (its -lm is): passed through as given


def test_owned_flags_are_replaced_and_sampling_flags_pass_through_with_their_values() -> None:
    cmd = parse_command(DOCS[6])
    assert cmd.replaced == ("--host", "0.0.0.0", "--log-file", "s.log")
    assert cmd.passthrough == ("-np", "4", "--cache-ram", "8192", "--temp", "0.6", "--top-k", "20")
    said = listed(cmd)
    assert said[0] == "the study's model and -c (your -m m.gguf)"
    assert "passed through as given: -np 4 --cache-ram 8192 --temp 0.6 --top-k 20" in said
    assert "replaced by xover's own: --host 0.0.0.0 --log-file s.log" in said


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("llama-server -m m.gguf -ub abc", "--baseline -ub: ubatch-size must be an integer of at least 1"),
        ("llama-server -ngl 99", "names no model: add -m FILE.gguf"),
        ("llama-server -m 'm.gguf", "cannot read the command (No closing quotation): check its quotes"),
        ("llama-server -m m.gguf -rtr", "-rtr is a flag of ik_llama.cpp's llama-server, not llama.cpp's"),
        ("llama-cli -m m.gguf", "'llama-cli' is not llama-server"),
        ("llama-server -m m.gguf -c many", "--baseline -c: give a number of tokens, got 'many'"),
        ("llama-server -m m.gguf -fa sometimes", "flash-attn must be one of"),
        ("llama-server -m", "-m needs a value"),
        ("", "give a llama-server command"),
    ],
)
def test_a_command_xover_cannot_run_is_refused_in_one_line_that_names_it(text: str, names: str) -> None:
    with pytest.raises(XoverError) as e:
        parse_command(text)
    assert names in str(e.value) and "\n" not in str(e.value)


def test_ik_llama_cpp_commands_read_with_its_own_flags() -> None:
    cmd = parse_command("llama-server -m m.gguf -ngl 99 -rtr -no-fmoe -amb 512", engine="ik_llama.cpp")
    assert dict(cmd.settings) == {"n-gpu-layers": "99", "run-time-repack": "1", "fused-moe": "0",
                                  "attention-max-batch": "512"}  # fmt: skip
    assert cmd.config().engine == "ik_llama.cpp" and parse_command(cmd.text(), engine="ik_llama.cpp") == cmd


def test_flag_equals_forms_split_only_long_flags() -> None:
    assert split_command("--model=a=b.gguf -c 4") == ["--model", "a=b.gguf", "-c", "4"]


def test_a_baseline_leads_the_study_and_a_spec_config_can_be_a_command() -> None:
    from xover.domain.study_spec import default_spec, spec_from_dict, with_baseline

    spec = with_baseline(default_spec(), "llama-server -m tiny.gguf -ngl 99 -ub 64 --jinja")
    yours = spec.configs[0]
    assert yours.name == "yours" and dict(yours.settings) == {"n-gpu-layers": "99", "ubatch-size": "64"}
    assert yours.server_args == ("--jinja",) and spec.pairs[0] == ("yours", "fa=on")
    with pytest.raises(XoverError, match="already has a configuration named 'yours'"):
        with_baseline(spec, "llama-server -m m.gguf")
    doc = {"model": {"preset": "tiny-moe"},
           "config": [{"name": "mine", "command": "llama-server -m x.gguf -t 1 -fa off"}, {"name": "b", "threads": 2}]}  # fmt: skip
    mine = spec_from_dict(doc).configs[0]
    assert mine.name == "mine" and dict(mine.settings) == {"threads": "1", "flash-attn": "off"}


def test_the_study_record_keeps_the_commands_as_given() -> None:
    from xover.domain.artifacts import StudyRecord

    rec = StudyRecord(("yours", "a"), (("yours", "a"),), (200,), (10_000, 40_000), commands=(("yours", DOCS[3]),))
    assert StudyRecord.from_body(rec.to_body()) == rec
    assert StudyRecord.from_body({**rec.to_body(), "commands": []}).commands == ()  # an older store: none


def test_what_to_change_is_the_tuned_settings_against_the_command_and_a_command_to_paste() -> None:
    from xover.domain.command_line import diff
    from xover.domain.config import LlamaConfig

    cmd = parse_command("llama-server -m m.gguf -c 32768 -ngl 99 --n-cpu-moe 20 -t 8 -ub 2048 --jinja")
    tuned = LlamaConfig(
        "yours tuned",
        (("n-cpu-moe", "20"), ("n-gpu-layers", "99"), ("load-mode", "none"), ("ubatch-size", "4096")),
        server_args=("--jinja",),
    )
    d = diff(cmd, tuned)
    assert d.added == ("-lm none",) and d.removed == ("-t 8",) and d.changed == ("-ub 2048 -> -ub 4096",)
    assert d.command == "llama-server -m m.gguf -c 32768 -ncmoe 20 -ngl 99 -lm none -ub 4096 --jinja"
    assert parse_command(d.command).config("yours tuned") == tuned  # what is pasted runs the tuned settings
    assert diff(cmd, cmd.config()).empty
