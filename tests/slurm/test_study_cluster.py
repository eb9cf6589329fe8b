"""The recipe study on the local SLURM cluster at tiny sizes: tools/study_cluster.py submits every run (training
through slurm/pretrain_135m.sh, evaluation after it), collect aggregates them with the decision rule, and a
second submit skips the evaluated runs."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cplm_megatron.model.config import load_preset
from tests.slurm.jobs import JOB_TIMEOUT, REPO, job_env, tiny_cpu_settings

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ITERS = 4


@pytest.fixture(scope="module")
def cluster(local_slurm):
    local_slurm.ensure(nodes=2)
    return local_slurm


def _wait_for(job_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queued = set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout.split())
        if not queued & set(job_ids):
            return
        time.sleep(2)
    subprocess.run(["scancel", *job_ids], check=False)
    pytest.fail(f"jobs {job_ids} did not finish within {timeout:.0f} s (cancelled)")


def test_the_study_submits_evaluates_and_collects_on_slurm(cluster, stdlib_corpus, tmp_path):
    study = tmp_path / "study"
    tool = [sys.executable, "tools/study_cluster.py"]
    submit = [*tool, "submit", "--output", str(study), "--data", str(stdlib_corpus.root), "--scales", "135m",
              "--arms", "baseline,mixture", "--seeds", "1,2", "--iters", str(ITERS), "--eval-interval", "2",
              "--checkpoint-interval", "2", "--eval-limit", "4", "--no-val-all", "--passkey-lengths", "64", "--time", "00:10:00",
              "--sbatch-arg=--ntasks-per-node=1", "--set", *tiny_cpu_settings(stdlib_corpus, ITERS),
              "train.eval_interval=2", "train.eval_iters=2"]
    sent = subprocess.run(submit, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300, check=False)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "4 runs: arms baseline, mixture x seeds [1, 2] x scales 135m" in sent.stdout and "GPU-hours" in sent.stdout
    runs = json.loads((study / "study.json").read_text())["runs"]
    assert sorted(runs) == ["135m-baseline-s1", "135m-baseline-s2", "135m-mixture-s1", "135m-mixture-s2"]
    ids = [job for r in runs.values() for job in (r["jobs"]["train"], r["jobs"]["eval"])]
    _wait_for(ids, 2 * JOB_TIMEOUT)
    for name in runs:
        logs = sorted((study / "logs").glob(f"study-*{name}-*.out"))
        assert (study / "runs" / name / "eval.json").is_file(), "\n".join(p.read_text()[-2000:] for p in logs)

    collected = subprocess.run([*tool, "collect", "--output", str(study)], cwd=REPO, env=job_env(),
                               capture_output=True, text=True, timeout=300, check=False)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    summary = json.loads((study / "summary.json").read_text())
    scale = summary["scales"]["135m"]
    assert scale["seeds"] == [1, 2] and list(scale["arms"]) == ["baseline", "mixture"]
    tiny = load_preset("tiny")  # the recipe at the test's tiny size (--set model.preset=tiny ...)
    assert scale["model"]["hidden"] == tiny.hidden_size and scale["tokens"] == ITERS * 4 * stdlib_corpus.train.seq_len
    decision = summary["decision"]  # mixture, the only CPLM arm planned, is credited or says why not
    assert decision["default"] == ("mixture" if decision["credited"] == ["mixture"] else "baseline")
    assert decision["credited"] == ["mixture"] or "not below the baseline" in decision["not_credited"]["mixture"]
    assert summary["decision"]["provisional"] is False and summary["planned_scales"] == ["135m"]
    assert scale["cache_control"]["mean_std"]["val_loss"]["n"] == 2  # the baselines' continuous-cache control
    report = (study / "report.md").read_text()
    assert "(a SLURM cluster)" in report and "## Decision" in report

    again = subprocess.run(submit, cwd=REPO, env=job_env(), capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and again.stdout.count("evaluated already, not submitted") == 4, again.stdout
