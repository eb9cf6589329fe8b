"""Smoke test of benchmarks/lm_head_loss.py --quick on CPU: Megatron's path and ours per size, memory from
torch's MemTracker, values and gradients compared, ratios reported, the fused kernels in the interpreter."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.lm_head_loss"  # run as users do: python -m, from the checkout's root


def test_quick_cpu_run_reports_memory_and_time_ratios(tmp_path):
    out = tmp_path / "lm_head.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)  # the script turns the interpreter on by itself on CPU
    result = subprocess.run([sys.executable, "-m", MODULE, "--quick", "--json", str(out)], env=env, cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert all(r["status"] == "ok" and r["time_s"] > 0 for r in rows), rows
    sizes = {(r["hidden"], r["seq"]) for r in rows if r["impl"] == "chunked"}
    assert len(sizes) == 2
    for hidden, seq in sizes:
        meg = next(r for r in rows if (r["impl"], r["hidden"], r["seq"]) == ("megatron", hidden, seq))
        ours = next(r for r in rows if (r["impl"], r["hidden"], r["seq"]) == ("chunked", hidden, seq))
        vocab = ours["vocab"]
        # Megatron keeps the fp32 softmax [seq, V] for the backward; ours 12 bytes per token
        assert meg["saved_bytes"] >= 4 * seq * vocab and ours["saved_bytes"] <= 12 * seq
        assert all(err <= 1e-5 for err in ours["max_rel_err"].values()), ours  # fp32, same computation
        ratio = report["ratios"][f"chunked[h={hidden},seq={seq},V={vocab},float32]"]
        assert ratio["memory_ratio"] == round(ours["working_bytes"] / meg["working_bytes"], 4)
        assert ratio["time_ratio"] > 0
    fused = [r for r in rows if r["impl"] == "fused"]
    assert fused and "NOT a speed measurement" in fused[0]["note"]
    assert all(err <= 1e-5 for err in fused[0]["max_rel_err"].values())
    assert "memory x" in result.stdout and "time x" in result.stdout


def test_a_failing_variant_is_reported_and_the_others_kept(tmp_path):
    """A variant that raises (here an unknown model.lm_head_loss) becomes a failed row; Megatron's row and the
    JSON (written after every size) are still there, and the exit code says something failed."""
    out = tmp_path / "lm_head.json"
    code = ("import sys; from benchmarks import lm_head_loss as b\n"
            "real = b.variants_for\n"
            "b.variants_for = lambda quick, chunks: real(quick, chunks)[:1] + [('broken', 'no-such-loss', None)]\n"
            f"sys.exit(b.main(['--quick', '--sizes', '64x64', '--json', {str(out)!r}]))")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(out.read_text())
    status = {(r["impl"], r["hidden"]): r["status"] for r in report["rows"]}
    assert status[("megatron", 64)] == "ok" and status[("broken", 64)].startswith("failed: ConfigError"), status
    assert report["complete"]


def test_the_smollm2_recipes_choose_their_lm_head_loss_by_memory():
    """The recipes take `auto` (model/lm_head_choice.py): on an H200 the chunked loss cost 1.43x the 135M step
    time to save 4.5 GiB of 139 (results/gpu/2026-12-04). With each recipe's own micro-batch and
    sequence, auto keeps Megatron's logits on an 80 GiB GPU and takes the fused loss on a 24 GiB one at 135M."""
    import yaml

    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.lm_head_choice import choose_lm_head_loss
    from cplm_megatron.model.sizing.accounting import GIB

    for recipe in ("smollm2_135m", "smollm2_360m", "smollm2_1p7b", "smollm2_1p7b_32k"):
        config = yaml.safe_load((REPO / "configs" / f"{recipe}.yaml").read_text())
        assert config["model"]["lm_head_loss"] == "auto", recipe
        model, train, cp = load_preset(config["model"]["preset"]), config["train"], config["parallel"].get("cp", 1)
        tokens = train["seq_len"] * train["micro_batch"] // cp
        assert choose_lm_head_loss(model, tokens, 1, 2, 80 * GIB, "80 GiB", True).path == "megatron", recipe
        if recipe == "smollm2_135m":
            assert choose_lm_head_loss(model, tokens, 1, 2, 24 * GIB, "24 GiB", True).path == "fused"
