"""slurm/pretrain_1p7b.sh on one emulated 8-GPU node with 2 CPU tasks: a run to the end, a failure
that must not be requeued, and the time-limit warning -> checkpoint -> requeue -> resume cycle."""
from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from tests.slurm.jobs import (
    PRETRAIN_1P7B,
    Job,
    job_field,
    latest_checkpoint,
    logged_iterations,
    median_step_seconds,
    read_summary,
    script_directive,
    slurm_seconds,
    tiny_cpu_overrides,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ONE_NODE_TWO_TASKS = ["--nodes=1", "--ntasks-per-node=2"]
BASELINE_ITERS = 20
# Training time of the requeue run at the uninterrupted run's speed. SLURM checks time limits every
# 30 s, so the warning arrives within ~30 s of arming it and must find the training still running:
# 65 s leaves 40 s even if this run is 1.6x faster than the uninterrupted one.
REQUEUE_RUN_SECONDS = 65


@pytest.fixture(scope="module")
def cluster(local_slurm):
    local_slurm.ensure(nodes=1)
    return local_slurm


@pytest.fixture(scope="module")
def uninterrupted(cluster, stdlib_corpus, tmp_path_factory) -> tuple[Job, int, Path]:
    """A run of BASELINE_ITERS iterations to the end: (job, exit code, run dir)."""
    root = tmp_path_factory.mktemp("slurm-1node")
    run_dir = root / "run"
    job = Job(PRETRAIN_1P7B, ONE_NODE_TWO_TASKS, tiny_cpu_overrides(stdlib_corpus, run_dir, BASELINE_ITERS),
              root / "slurm.out")
    return job, job.wait(), run_dir


def test_runs_to_the_end_and_writes_metrics_summary_and_checkpoint(uninterrupted):
    job, rc, run_dir = uninterrupted
    assert rc == 0, job.tail()
    log = job.log()
    assert f"job {job.job_id} restart 0 on " in log and ": 2 tasks, rendezvous " in log
    assert "[train] layout tp=1 pp=1 dp=2" in log and "[launch" in log and "training finished" in log
    assert logged_iterations(run_dir) == list(range(1, BASELINE_ITERS + 1))
    summary = read_summary(run_dir)
    assert summary["iterations"] == BASELINE_ITERS and summary["nodes"] == 1 and summary["preset"] == "tiny"
    assert summary["layout"]["world_size"] == 2 and summary["layout"]["dp"] == 2
    assert summary["tokens_per_sec"] > 0 and summary["step_time"] > 0
    assert latest_checkpoint(run_dir).name == f"iter_{BASELINE_ITERS:07d}"
    # launch.sh also appends the step's output to the run directory
    run_log = (run_dir / "logs" / f"slurm-{job.job_id}.log").read_text()
    assert f"iter {BASELINE_ITERS}/{BASELINE_ITERS}" in run_log and "training finished" in run_log


def test_a_failed_run_is_not_requeued(cluster, stdlib_corpus, tmp_path):
    job = Job(PRETRAIN_1P7B, ONE_NODE_TWO_TASKS,
              tiny_cpu_overrides(stdlib_corpus, tmp_path / "run", 4, f"data.streams={tmp_path / 'no-such-data'}"),
              tmp_path / "slurm.out")
    rc = job.wait()
    log = job.log()
    assert rc == 2, log  # missing data is bad input: exit 2, one line per rank, and no requeue
    assert "error: dataset directory not found" in log
    assert "training refused its input (exit 2, the error line above names the fix): not requeueing" in log
    assert "requeueing job" not in log and "restart 1" not in log
    assert not (tmp_path / "run" / "logs").exists()  # a refused launch leaves the run directory as it was


def test_time_limit_warning_checkpoints_requeues_and_resumes(cluster, uninterrupted, stdlib_corpus, tmp_path):
    job0, rc0, run0 = uninterrupted
    assert rc0 == 0, job0.tail()
    # The uninterrupted run ends at its train.iters; size this one so the warning lands mid-training.
    iters = max(BASELINE_ITERS, math.ceil(REQUEUE_RUN_SECONDS / median_step_seconds(run0)))
    run_dir = tmp_path / "run"
    job = Job(PRETRAIN_1P7B, ONE_NODE_TWO_TASKS, tiny_cpu_overrides(stdlib_corpus, run_dir, iters),
              tmp_path / "slurm.out")
    job.wait_for_log(rf"iter 1/{iters} ", timeout=240)  # training: the stop handlers are installed

    # A short time limit: leave no more than the script's own --signal=B:USR1@<warn> lead time, so
    # slurmctld's next time-limit check (every 30 s) sends the warning to the batch shell.
    warn = int(script_directive(PRETRAIN_1P7B, "signal").rsplit("@", 1)[1])
    original_limit = job_field(job.job_id, "TimeLimit")
    elapsed = slurm_seconds(job_field(job.job_id, "RunTime"))
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", f"TimeLimit={(elapsed + warn) // 60}"], check=True)
    job.wait_for_log(r"received SIGUSR1: forwarding USR1 to the training step", timeout=75)
    # the restarted job gets its full time limit back (else it would be warned again at once)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", f"TimeLimit={original_limit}"], check=True)

    assert job.wait() == 0, job.tail()
    log = job.log()
    stop = re.search(r"\[train\] stopping at iteration (\d+) \(signal 10\)", log)
    assert stop, log
    stopped_at = int(stop.group(1))
    assert 0 < stopped_at < iters
    assert "training stopped with a checkpoint (exit 75)" in log and f"requeueing job {job.job_id} (restart 1)" in log
    assert f"job {job.job_id} restart 1 on " in log
    assert f"resumed from {run_dir / 'checkpoints' / f'iter_{stopped_at:07d}'} at iteration {stopped_at}" in log
    assert log.count("training finished") == 1 and "restart 2" not in log
    # Same end as an uninterrupted run: train.iters iterations, each logged once, nothing lost or repeated.
    assert logged_iterations(run_dir) == list(range(1, iters + 1))
    assert read_summary(run_dir)["iterations"] == iters
    assert latest_checkpoint(run_dir).name == f"iter_{iters:07d}"
