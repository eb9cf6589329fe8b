"""pretrain/pretrain_cplm.py for the training tests on the real corpus (processes: tests/harness.py)."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from cplm_megatron.parallel.distributed import free_port  # noqa: F401 - tests use pu.free_port
from cplm_megatron.training.signals import RESUME_EXIT_CODE
from tests import harness
from tests.training import faults

REPO = harness.REPO


def tiny_overrides(corpus, run_dir: Path, iters: int = 10, **extra) -> List[str]:
    """A fast CPU recipe on the embedded corpus (its seq_len, 2 x 2 micro-batches per step)."""
    o = {
        "run.dir": str(run_dir),
        "model.vocab_size": corpus.tokenizer.vocab_size,
        "copy_head.head_dim": 16,
        "train.iters": iters,
        "train.seq_len": corpus.train.seq_len,
        "train.micro_batch": 2,
        "train.global_batch": 4,
        "train.log_interval": 1,
        "train.eval_interval": 0,
        "schedule.warmup_iters": 2,
        "checkpoint.interval": 3,
        "checkpoint.keep": 2,
        "data.streams": str(corpus.train_dir),
        "data.val_streams": str(corpus.val_dir),
        "logging.wandb": "false",
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def _mode(mode: Optional[str], launcher: bool) -> str:
    """`launcher=True` is pretrain/launch_torchrun.py; otherwise warm processes unless a mode is named."""
    if launcher:
        return "launcher"
    return mode or "warm"


def _script(fault: Optional[Tuple[str, int]]) -> Optional[List[str]]:
    """The trainer script: pretrain_cplm.py, or tests/training/faults.py injecting `fault` (name, iteration)."""
    return None if fault is None else [str(faults.SCRIPT), *faults.fault_args(*fault)]


def run(nproc: int, overrides: List[str], timeout: int = 600, extra_env: Optional[Dict[str, str]] = None,
        launcher: bool = False, mode: Optional[str] = None,
        fault: Optional[Tuple[str, int]] = None) -> subprocess.CompletedProcess:
    """Run to completion (tests/harness.py run_pretrain): warm processes by default; `mode` "python",
    "torchrun" or "launcher" where the interpreter or the launcher is what the test is about; `fault`:
    (name, iteration) of tests/training/faults.py."""
    return harness.run_pretrain(nproc, overrides, _mode(mode, launcher), timeout, extra_env, script=_script(fault))


def start(nproc: int, overrides: List[str], log: Path, extra_env: Optional[Dict[str, str]] = None,
          launcher: bool = False, mode: Optional[str] = None, fault: Optional[Tuple[str, int]] = None):
    """Start a run in its own process group(s) (so the test can kill or signal all of it); output to `log`."""
    return harness.start_pretrain(nproc, overrides, log, _mode(mode, launcher), extra_env, script=_script(fault))


def metrics(run_dir: Path) -> List[Dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def losses(run_dir: Path) -> Dict[int, float]:
    return {r["iteration"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def stopped_for_resume(returncode: int, output: str) -> bool:
    """The run exited with the "resume me" code (torchrun reports its workers' codes as `exitcode  : 75`)."""
    return returncode == RESUME_EXIT_CODE or f"exitcode  : {RESUME_EXIT_CODE}" in output


def assert_bad_input(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2 and exactly one line on stderr, `error: ...`, holding every fragment; returns the line.
    (Rank 0's `[compat]` line, which names the CPU patches applied at start-up, is an info line, not an error.)"""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("[compat] ")]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def files_of(directory: Path) -> Dict[str, bytes]:
    """Every file under `directory` with its content (to show nothing was changed)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(Path(directory).rglob("*")) if p.is_file()}


def assert_losses_match(run_dir: Path, reference: Dict[int, float], iterations) -> None:
    """The run's losses at `iterations` equal the reference's within 1e-4 (other layouts sum in other orders)."""
    got = losses(run_dir)
    for it in iterations:
        # each step's fp32 reductions differ by ~1e-5 relative between layouts (tests/parallel/test_layouts.py);
        # over the <= 10 compared steps at lr 2e-3 these compound into the losses: 1e-4 relative
        assert got[it] == pytest.approx(reference[it], rel=1e-4), it


def wait_for(predicate, timeout: float = 300, poll: float = 0.05, proc: Optional[subprocess.Popen] = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before the condition held")
        time.sleep(poll)
    raise TimeoutError("condition not reached")


kill_group = harness.kill_group
worker_pids = harness.worker_pids
