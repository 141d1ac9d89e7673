"""llama-fit-params' answer parsed (llama.cpp's own --fit, shown beside the planner): known answers from the
line it prints, including the forms seen on an H200 under a 24 GiB budget with gpt-oss-120b."""

from xover.llamacpp.fitparams import FitChoice, fit_args, parse_fit_args

README_LINE = (
    r'-c 4096 -ngl 48 -ot "blk\.14\.ffn_(up|down|gate)_(ch|)exps=CPU,blk\.15\.ffn_(up|down|gate)_(ch|)exps=CPU,'
    r'blk\.16\.ffn_(up|down|gate)_(ch|)exps=CPU"'
)
H200_LINE = (
    r'-c 8192 -ngl 37 -ot "blk\.12\.ffn_(gate|gate_up|down).*=CPU,blk\.13\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU,'
    r'blk\.14\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"'
)


def test_the_printed_line_gives_context_layers_and_the_experts_moved():
    c = parse_fit_args("llama_params_fit: ...\n" + README_LINE + "\n")
    assert c is not None
    assert (c.n_ctx, c.n_gpu_layers, c.cpu_expert_layers, c.partial_layers) == (4096, 48, (14, 15, 16), ())
    assert c.describe() == "experts of 3 layers on the CPU (-ngl 48)"


def test_a_layer_with_only_some_projections_moved_counts_as_partial():
    c = parse_fit_args(H200_LINE)
    assert c is not None and c.cpu_expert_layers == (12, 13, 14) and c.partial_layers == (12,)
    single = parse_fit_args(r'-c 4096 -ngl 48 -ot "blk\.15\.ffn_up_exps=CPU"')
    assert single is not None and single.cpu_expert_layers == (15,) and single.partial_layers == (15,)
    assert FitChoice.from_dict(c.to_dict()) == c


def test_nothing_moved_and_no_answer():
    c = parse_fit_args("-c 4096 -ngl -1\n")
    assert c is not None and c.cpu_expert_layers == () and c.n_gpu_layers == -1
    assert parse_fit_args("llama_fit_params: failed to fit CLI arguments to free memory, exiting...\n") is None
    # overrides to another device than the CPU are not experts on the CPU
    other = parse_fit_args(r'-c 4096 -ngl 48 -ot "blk\.3\.ffn_(up|down|gate)_(ch|)exps=CUDA1"')
    assert other is not None and other.cpu_expert_layers == ()


def test_only_the_options_that_size_buffers_are_passed_on():
    from xover.domain.config import LlamaConfig

    settings = (("n-cpu-moe", "12"), ("n-gpu-layers", "99"), ("ubatch-size", "4096"), ("batch-size", "4096"))
    config = LlamaConfig("x", (*settings, ("load-mode", "none"), ("threads", "8")))
    assert fit_args(config) == ["-ub", "4096", "-b", "4096"]  # the placement llama.cpp's fit decides is left out
    assert fit_args(LlamaConfig("x", (("flash-attn", "on"), ("cache-type-k", "q8_0")))) == ["-fa", "on", "-ctk", "q8_0"]
