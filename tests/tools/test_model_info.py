"""tools/model_info.py: counts, FLOPs and memory for a preset and layout; clear layout errors."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args):
    return subprocess.run([sys.executable, "tools/model_info.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


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


def test_table_output_and_layout_error():
    proc = run("--preset", "tiny", "--tp", "2")
    assert proc.returncode == 0 and "total parameters" in proc.stdout
    proc = run("--preset", "smollm2-360m", "--tp", "2")
    assert proc.returncode == 2
    assert "model.num_attention_heads=15 is not divisible by parallel.tp=2" in proc.stderr
