"""Two emulated 8-GPU nodes: slurm/pretrain_1p7b.sh across nodes (2 CPU tasks each, TP=2 x DP=2), and
a 2-configuration scaling study (1 and 2 nodes) through tools/scaling_study.py and scaling_report.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.slurm.jobs import (
    JOB_TIMEOUT,
    PRETRAIN_1P7B,
    REPO,
    Job,
    job_env,
    latest_checkpoint,
    logged_iterations,
    read_summary,
    tiny_cpu_overrides,
    tiny_cpu_settings,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERS = 8


@pytest.fixture(scope="module")
def cluster(local_slurm):
    local_slurm.ensure(nodes=2)
    return local_slurm


def test_runs_across_two_nodes_with_two_tasks_each(cluster, stdlib_corpus, tmp_path):
    run_dir = tmp_path / "run"
    job = Job(PRETRAIN_1P7B, ["--nodes=2", "--ntasks-per-node=2"],
              tiny_cpu_overrides(stdlib_corpus, run_dir, ITERS, "parallel.tp=2"), tmp_path / "slurm.out")
    assert job.wait() == 0, job.tail()
    log = job.log()
    # rendezvous on the first node of the allocation, found by launch.sh via scontrol show hostnames
    assert f"job {job.job_id} restart 0 on c[1-2]: 4 tasks, rendezvous c1:" in log
    assert "[train] layout tp=2 pp=1 dp=2" in log
    assert logged_iterations(run_dir) == list(range(1, ITERS + 1))
    summary = read_summary(run_dir)
    assert summary["nodes"] == 2 and summary["layout"]["world_size"] == 4 and summary["layout"]["tp"] == 2
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint.name == f"iter_{ITERS:07d}" and len(list(checkpoint.glob("*.distcp"))) >= 2


def test_two_config_scaling_study_writes_records_report_and_plots(cluster, stdlib_corpus, tmp_path):
    study = tmp_path / "study"
    sweep = subprocess.run(
        [sys.executable, "tools/scaling_study.py", "--output", str(study), "--sizes", "1p7b", "--nodes", "1", "2",
         "--layouts", "tp1pp1", "--copy-head", "on", "--ntasks-per-node", "1", "--iters", str(ITERS), "--chain",
         "--wait", "--poll", "2", "--set", *tiny_cpu_settings(stdlib_corpus, ITERS)],
        cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=2 * JOB_TIMEOUT, check=False)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    jobs = json.loads((study / "study.json").read_text())["jobs"]
    assert [(j["name"], j["nodes"]) for j in jobs] == [("1p7b-n1-tp1pp1-cplm", 1), ("1p7b-n2-tp1pp1-cplm", 2)]
    for j in jobs:
        record = read_summary(study / "runs" / j["name"])
        assert record["nodes"] == j["nodes"] and record["layout"]["world_size"] == j["nodes"]
        assert record["iterations"] == ITERS and record["copy_head"] is True
        assert record["tokens_per_sec"] > 0 and record["config_hash"]
    assert f"--dependency=afterany:{jobs[0]['job_id']}" in jobs[1]["command"]  # --chain
    for j in jobs:
        assert "training finished" in (study / "logs" / f"scal-{j['name']}-{j['job_id']}.out").read_text()

    report_dir = study / "report"
    report = subprocess.run([sys.executable, "tools/scaling_report.py", str(study / "runs"), "--output",
                             str(report_dir)], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    text = (report_dir / "report.md").read_text()
    assert "| tiny | on | 1 | 1 | tp1pp1 |" in text and "| tiny | on | 2 | 2 | tp1pp1 |" in text
    assert "No copy-head on/off pairs" in text
    for plot in ("throughput_vs_nodes.png", "scaling_efficiency.png"):
        assert (report_dir / plot).read_bytes().startswith(b"\x89PNG"), plot
