"""Helpers for the SLURM tests: submit the real sbatch scripts, follow their output, read their runs."""
from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import read_latest
from cplm_megatron.data.stdlib_corpus import StdlibCorpus

REPO = Path(__file__).resolve().parents[2]
SLURM_DIR = REPO / "slurm"
PRETRAIN_1P7B = SLURM_DIR / "pretrain_1p7b.sh"
JOB_TIMEOUT = 420  # seconds; a tiny CPU run takes 30-60 s on a 2-core machine


def job_env() -> dict[str, str]:
    """The submitting environment (sbatch exports it to the job): one thread per task, since the
    emulated nodes advertise more CPUs than the machine has; no tokenizer threads, offline wandb;
    CPLM_ALLOW_CPU=1 because the fake gres GPUs promise CUDA devices that a CPU machine lacks."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline", CPLM_ALLOW_CPU="1")
    return env


def tiny_cpu_settings(corpus: StdlibCorpus, iters: int, *extra: str) -> list[str]:
    """`key=value` overrides turning a GPU recipe into a tiny CPU run on the embedded corpus."""
    return ["model.preset=tiny", f"model.vocab_size={corpus.tokenizer.vocab_size}", "precision.dtype=fp32",
            "copy_head.head_dim=32", "train.tokens=null", f"train.iters={iters}", "train.micro_batch=2",
            "train.global_batch=4", f"train.seq_len={corpus.train.seq_len}", "train.eval_interval=0",
            "train.log_interval=1", f"data.streams={corpus.train_dir}", f"data.val_streams={corpus.val_dir}",
            "data.num_workers=0", "optimizer.distributed=false", "optimizer.overlap_grad_reduce=false",
            "optimizer.overlap_param_gather=false", "checkpoint.async_save=false", "logging.wandb=false", *extra]


def tiny_cpu_overrides(corpus: StdlibCorpus, run_dir: Path, iters: int, *extra: str) -> list[str]:
    """The training arguments of a tiny CPU run into `run_dir` (`extra` overrides apply last)."""
    return ["--set", *tiny_cpu_settings(corpus, iters, f"run.dir={run_dir}", *extra)]


class Job:
    """`sbatch --wait SCRIPT ...` running in the background, with its batch output file."""

    def __init__(self, script: Path, sbatch_args: list[str], train_args: list[str], output: Path):
        self.output = output
        cmd = ["sbatch", "--wait", f"--output={output}", *sbatch_args, str(script), *train_args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        first = self.proc.stdout.readline()
        match = re.search(r"Submitted batch job (\d+)", first)
        if not match:
            self.proc.wait()
            pytest.fail(f"sbatch did not submit: {first}{self.proc.stderr.read()}\n  command: {' '.join(cmd)}")
        self.job_id = match.group(1)

    def log(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_for_log(self, pattern: str, timeout: float) -> re.Match:
        """The first match of `pattern` in the batch output, waiting for it to appear."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log())
            if match:
                return match
            if self.proc.poll() is not None:
                pytest.fail(f"job {self.job_id} ended (sbatch exit {self.proc.returncode}) before "
                            f"{pattern!r} appeared in its output:\n{self.tail()}")
            time.sleep(0.5)
        pytest.fail(f"{pattern!r} did not appear in job {self.job_id}'s output within {timeout:.0f} s:\n{self.tail()}")

    def wait(self, timeout: float = JOB_TIMEOUT) -> int:
        """The job's exit code, as `sbatch --wait` returns it."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            subprocess.run(["scancel", self.job_id], check=False)
            pytest.fail(f"job {self.job_id} did not finish within {timeout} s (cancelled):\n{self.tail()}")


def job_field(job_id: str, name: str) -> str:
    """One `Name=value` field of `scontrol show job`."""
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    match = re.search(rf"\b{name}=(\S+)", shown)
    assert match, f"no {name}= in scontrol show job {job_id}:\n{shown}"
    return match.group(1)


def slurm_seconds(duration: str) -> int:
    """SLURM's [days-]hours:minutes:seconds (or minutes:seconds) as seconds."""
    days, _, clock = duration.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return int(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def logged_iterations(run_dir: Path) -> list[int]:
    """Iterations recorded in <run_dir>/metrics.jsonl, in file order."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["iteration"] for line in path.read_text().splitlines() if line.strip()]


def median_step_seconds(run_dir: Path) -> float:
    """Median wall time between consecutive logged iterations (train.log_interval=1): a step time
    that ignores the slow first steps."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return statistics.median(b["time"] - a["time"] for a, b in itertools.pairwise(records))


def read_summary(run_dir: Path) -> dict:
    """The run's record (training/run_record.py) as its JSON content."""
    from cplm_megatron.training.run_record import read_run_record

    return read_run_record(run_dir).to_json()


def latest_checkpoint(run_dir: Path) -> Path:
    """The complete checkpoint <run_dir>/checkpoints/latest names (the one a relaunch resumes from)."""
    path = read_latest(run_dir / "checkpoints")
    assert path is not None, f"no checkpoint under {run_dir / 'checkpoints'}"
    return path


def script_directive(script: Path, option: str) -> str:
    """The value of `#SBATCH --option=value` in a script."""
    match = re.search(rf"^#SBATCH --{option}=(\S+)", script.read_text(), re.MULTILINE)
    assert match, f"{script} has no #SBATCH --{option}"
    return match.group(1)
