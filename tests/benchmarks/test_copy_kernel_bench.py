"""Smoke test of benchmarks/copy_kernel.py --quick on CPU (torch paths timed, fused in the interpreter)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.copy_kernel"  # run as users do: python -m, from the checkout's root


def test_quick_cpu_run_writes_all_rows(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)  # the script must turn the interpreter on by itself on CPU
    result = subprocess.run([sys.executable, "-m", MODULE, "--quick", "--json", str(out)], env=env, cwd=REPO,
                            capture_output=True, text=True, check=False, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert {(r["impl"], r["mode"]) for r in rows} >= {
        ("naive", "fwd"), ("naive", "fwd+bwd"), ("chunked", "fwd"), ("chunked", "fwd+bwd"),
        ("fused (interpreter)", "fwd"), ("fused (interpreter)", "fwd+bwd"),
    }
    assert all(r["status"] == "ok" and r["time_ms"] > 0 for r in rows), rows
    interpreted = [r for r in rows if r["impl"].startswith("fused")]
    assert {r["dtype"] for r in interpreted} == {"fp32", "fp8"}
    assert all("NOT a speed measurement" in r["note"] for r in interpreted)
    assert "fused (interpreter)" in result.stdout
    # memory on CPU comes from torch's MemTracker: the naive path holds at least one fp32 [1, 4, T, T] score
    # tensor, the fused kernel (here interpreted) none
    scores = 4 * 256 * 256 * 4
    naive_fwd = next(r for r in rows if r["impl"] == "naive" and r["mode"] == "fwd")
    fused_fwd = next(r for r in interpreted if r["dtype"] == "fp32" and r["mode"] == "fwd")
    assert naive_fwd["extra_mem_bytes"] >= scores
    assert 0 <= fused_fwd["extra_mem_bytes"] < 64 * 64 * 4  # T=64: less than a single [T, T] fp32 tile
