"""Smoke test of benchmarks/copy_head_overhead.py --quick on CPU: both variants timed in one run, memory measured."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.copy_head_overhead"  # run as users do: python -m, from the checkout's root


def test_quick_cpu_run_measures_both_variants(tmp_path):
    out = tmp_path / "overhead.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", MODULE, "--quick", "--json", str(out)], env=env, cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert (row["model"], row["seq_len"]) == ("tiny", 512)
    assert row["baseline_step_s"] > 0 and row["cplm_step_s"] > 0
    assert row["time_ratio"] == row["cplm_step_s"] / row["baseline_step_s"]
    # MemTracker follows tensor storages exactly: the copy head's activations and gradients come on top
    assert 0 < row["baseline_peak_mem_mib"] < row["cplm_peak_mem_mib"] < 4 * row["baseline_peak_mem_mib"]
    assert "MemTracker" in row["memory_measure"]
    assert "time x" in result.stdout
