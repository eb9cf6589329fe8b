"""The launcher's commands: python -m entry points (no checkout path), torchrun for several processes, the SLURM
lines of a run, and sbatch's job id or its refusal."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cplm_megatron.experiments.ablation.plan import AblationSettings, ablation_runs
from cplm_megatron.experiments.launch.launcher import eval_command, sbatch, slurm_commands, train_command


def _run():
    return ablation_runs(AblationSettings(experiments=("spamlang",), spamlang_vocabs=(4096,), spamlang_ties=(False,)),
                         None)[1]


def test_commands_are_modules_and_torchrun_takes_the_processes(tmp_path: Path):
    run, run_dir = _run(), tmp_path / "runs" / "r"
    one = train_command(run, run_dir).argv_list("python")
    assert one[:6] == ["python", "-m", "cplm_megatron.pretrain", "--config", "tiny", "--set"]
    assert one[6] == f"run.dir={run_dir}" and "copy_head.enabled=true" in one
    two = train_command(run, run_dir, processes=2).argv_list("python")
    assert two[:7] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                       "cplm_megatron.pretrain"] and two[-1] == "parallel.tp=2"
    ev = eval_command(run, run_dir).argv_list("python")
    assert ev[:3] == ["python", "-m", "cplm_megatron.evaluate"] and f"{run_dir}/eval.json" in ev
    assert "--all-checkpoints" in ev and not any("tools/" in a or "pretrain_cplm" in a for a in one + ev)


def test_slurm_lines_chain_the_evaluation_after_the_training(tmp_path: Path):
    run, run_dir = _run(), tmp_path / "runs" / "r"
    train, ev = slurm_commands(run, run_dir, tmp_path / "logs", ("--time=1:00:00",), ("--gpus=1",),
                               python="python", train_job="41")
    assert train[:3] == ["sbatch", "--parsable", f"--job-name=study-{run.name}"] and "--time=1:00:00" in train
    assert train[-1].startswith("--wrap=srun python -m cplm_megatron.pretrain --config tiny --set run.dir=")
    assert "--dependency=afterok:41" in ev and "--gpus=1" in ev
    assert ev[-1].startswith(f"--wrap=python -m cplm_megatron.evaluate --checkpoint {run_dir} ")
    with_script = slurm_commands(run, run_dir, tmp_path / "logs", train_script="slurm/pretrain_135m.sh")[0]
    assert with_script[with_script.index("slurm/pretrain_135m.sh") + 1:][:2] == ["--set", f"run.dir={run_dir}"]


def test_sbatch_returns_the_job_id_or_raises_its_message(tmp_path: Path):
    ok = [sys.executable, "-c", "print('4242;cluster')"]
    assert sbatch(ok, tmp_path) == "4242"
    refused = [sys.executable, "-c", "import sys; sys.stderr.write('invalid partition'); sys.exit(1)"]
    with pytest.raises(KeyError, match="sbatch failed \\(1\\): invalid partition"):
        sbatch(refused, tmp_path, KeyError)
