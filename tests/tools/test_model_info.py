"""tools/model_info.py: counts, FLOPs and memory for a preset and layout; clear layout errors."""
import json

import pytest

from tests import harness

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def run(*args):
    """main(args) in a warm process (test_table_output_and_layout_error runs the real command line)."""
    return harness.run_tool_warm("model_info", *args)


def test_json_report_for_smollm2_135m():
    proc = run("--preset", "smollm2-135m", "--json", "--tp", "1", "--dp", "8", "--seq-len", "2048")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["backbone_params"] == 134_515_008
    assert out["built_on_meta_device"]["backbone"] == 134_515_008
    assert out["copy_head_params"] == 2 * 576 * 256 + 577
    # 6N rule of thumb (non-embedding) + attention + LM head: the copy head adds well under 1%
    assert 0 < 3 * out["forward_flops_per_token"]["copy_head"] < 0.01 * out["train_flops_per_token"]
    mem = out["memory_per_gpu"]
    assert mem["optimizer_distributed_gib"] * 8 == mem["optimizer_gib"]


@pytest.mark.slow  # two starts of the tool (its command line): the pinned megatron-core's leg only
def test_table_output_and_layout_error():
    proc = harness.run_tool("model_info", "--preset", "tiny", "--tp", "2")  # the command line, exit codes included
    assert proc.returncode == 0 and "total parameters" in proc.stdout
    proc = harness.run_tool("model_info", "--preset", "smollm2-360m", "--tp", "2")
    assert proc.returncode == 2
    assert "model.num_attention_heads=15 is not divisible by parallel.tp=2" in proc.stderr


def test_gpu_memory_fit_and_plan_for_13b_on_one_node():
    proc = run("--preset", "llama-13b", "--json", "--seq-len", "4096", "--gpu-memory", "80GB", "--plan",
               "--lm-head-loss", "fused", "--offload-fraction", "0.5", "--dp", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    mem = out["memory_per_gpu"]
    assert mem["optimizer_host_gib"] > 0 and mem["optimizer_distributed_gib"] < mem["optimizer_gib"] / 8
    losses = out["lm_head_loss_per_micro_batch_gib"]
    assert losses["fused"]["peak"] < losses["chunked"]["peak"] < losses["megatron"]["peak"]
    assert out["fit"]["gpu_memory_gib"] == 80e9 / 2**30 and out["fit"]["fits"] is False  # 13B on one GPU
    fitting = out["plan"]["fitting"]
    assert fitting and all(r["fits"] and r["tp"] * r["pp"] > 1 for r in fitting)
    assert fitting[0]["offload_fraction"] == 0 and fitting[0]["extra_flops_pct"] == 0


def test_plan_table_and_bad_memory_arguments():
    proc = run("--preset", "smollm2-1.7b", "--seq-len", "8192", "--gpu-memory", "80GiB", "--plan")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fits GPUs of 80.0 GiB = 85.9 GB" in proc.stdout and "layouts of 8 GPUs that fit" in proc.stdout
    assert "megatron 2.250" in proc.stdout  # the LM-head loss line: bf16 logits + fp32 copy at seq 8192
    proc = run("--preset", "tiny", "--plan")
    assert proc.returncode == 2 and "--plan needs --gpu-memory" in proc.stderr
    proc = run("--preset", "tiny", "--gpu-memory", "80XB")
    assert proc.returncode == 2 and "expected a size like 80GB" in proc.stderr


def test_context_parallel_layout_and_its_errors():
    proc = run("--preset", "smollm2-1.7b", "--json", "--cp", "2", "--dp", "4", "--seq-len", "32768")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["layout"]["cp"] == 2 and "cp=2" in out["memory_per_gpu"]["assumptions"]
    proc = run("--preset", "tiny", "--cp", "2", "--seq-len", "250")
    assert proc.returncode == 2 and "--seq-len 250 is not divisible by 2 x --cp = 4" in proc.stderr


def test_pp_x_cp_is_refused_with_the_trainers_error():
    """The trainer refuses PP x CP before any process group (model/layout.py: check_context_parallel); model_info
    used to report such a layout. Both now give the one error line of the trainer's check."""
    from cplm_megatron.errors import ConfigError
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.layout import check_context_parallel
    from cplm_megatron.parallel.config import ParallelConfig

    with pytest.raises(ConfigError) as trainer:
        check_context_parallel(ParallelConfig(pp=2, cp=2), load_preset("tiny"), 256)
    proc = run("--preset", "tiny", "--pp", "2", "--cp", "2", "--seq-len", "256")
    errors = [line for line in proc.stderr.strip().splitlines() if not line.startswith("[compat] ")]  # info lines
    assert proc.returncode == 2 and errors == [f"error: {trainer.value}"], proc.stderr
    proc = run("--preset", "tiny", "--cp", "2", "--seq-len", "256", "--attention", "megatron")
    assert proc.returncode == 2 and "needs model.attention_impl=sdpa" in proc.stderr


@pytest.mark.parametrize("option", ["--seq-len", "--micro-batch", "--gpus", "--tp", "--dp"])
def test_negative_or_zero_sizes_are_refused(option):
    """Issue 30: negative sequence length, micro batch and GPU counts used to give a report."""
    for value in ("-4", "0"):
        proc = run("--preset", "tiny", option, value)
        assert proc.returncode == 2 and f"argument {option}: must be a positive integer" in proc.stderr, proc.stderr


def test_a_recipe_is_read_whole():
    """--config takes dp, seq, micro batch, loss path and head shape from the recipe: the 135M recipe on 8 GPUs is
    the preset with its settings typed out; command-line options and --set overrides win; `auto` is resolved for
    the GPU memory given (its 9 GiB of logits: Megatron's path on 80 GB GPUs, the fused loss on 24 GB ones); a TP
    that does not divide the heads is named as such."""
    recipe = run("--config", "configs/smollm2_135m.yaml", "--gpus", "8", "--gpu-memory", "80GB", "--json")
    typed = run("--preset", "smollm2-135m", "--json", "--dp", "8", "--seq-len", "2048", "--micro-batch", "16",
                "--copy-heads", "4", "--copy-head-dim", "64", "--lm-head-loss", "megatron", "--gpu-memory", "80GB")
    assert recipe.returncode == typed.returncode == 0, recipe.stderr[-2000:] + typed.stderr[-2000:]
    assert json.loads(recipe.stdout)["memory_per_gpu"] == json.loads(typed.stdout)["memory_per_gpu"]
    assert json.loads(recipe.stdout)["layout"]["lm_head_loss"] == "megatron"
    over = json.loads(run("--config", "configs/smollm2_135m.yaml", "--set", "copy_head.enabled=false",
                          "--dp", "4", "--seq-len", "4096", "--micro-batch", "8", "--gpu-memory", "24GB", "--json").stdout)
    assert over["layout"]["micro_batch"] == 8 and over["layout"]["dp"] == 4 and over["layout"]["seq_len"] == 4096
    assert over["copy_head_params"] == 0 and over["layout"]["lm_head_loss"] == "fused"  # 9 GiB > 25% of 24 GB
    bad = run("--config", "configs/tiny.yaml", "--set", "parallel.tp=3")
    assert bad.returncode == 2 and "model.num_attention_heads=4 is not divisible by parallel.tp=3" in bad.stderr


def test_a_recipe_keeps_its_own_layout_and_named_gpus_get_a_verdict():
    """The 1.7B recipe states dp=16 in its header: model_info takes it (it assumed 8 GPUs); without --gpu-memory
    the H100 80GB and H200 141GB each get a verdict, their memory in GiB and GB. The GPU check's 1.7B shape (one
    GPU, seq 4096, 16 sequences per step) holds micro-batch 4 on the H200 (78.5 GiB measured there) and 2 on an
    H100 (the planner's 79.0 GiB at micro-batch 4 is within an H100's 79.6 GiB, but not with the reserve)."""
    recipe = json.loads(run("--config", "configs/smollm2_1p7b.yaml", "--json").stdout)
    assert recipe["layout"]["dp"] == 16 and recipe["layout"]["layout_source"] == "dp from the recipe's header"
    assert run("--config", "configs/smollm2_1p7b.yaml", "--gpus", "8", "--json").returncode == 0
    check = run("--config", "configs/smollm2_1p7b.yaml", "--dp", "1", "--set", "train.seq_len=4096",
                "model.max_position_embeddings=4096", "train.global_batch=16")
    assert check.returncode == 0, check.stderr[-2000:]
    h100 = next(line for line in check.stdout.splitlines() if line.startswith("H100 80GB"))
    h200 = next(line for line in check.stdout.splitlines() if line.startswith("H200 141GB"))
    assert "(79.6 GiB = 85.5 GB)" in h100 and "does NOT fit at micro-batch 4; micro-batch 2 fits" in h100
    assert "(140.4 GiB = 150.8 GB)" in h200 and "fits at micro-batch 4; micro-batch 4 fits" in h200
    given = run("--config", "configs/smollm2_1p7b.yaml", "--gpu-memory", "80GB")
    assert "fits GPUs of 74.5 GiB = 80.0 GB" in given.stdout and "H100 80GB" not in given.stdout


def test_the_tool_is_a_thin_entry_point():
    from tests.harness import REPO

    assert len((REPO / "tools" / "model_info.py").read_text().splitlines()) <= 100
