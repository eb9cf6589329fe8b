"""A config the workers would refuse never reaches them as N tracebacks: pretrain/launch_torchrun.py checks it in
the parent before torchrun starts (one line, exit 2, nothing written); under plain torchrun rank 0 prints the one
line and the ranks exit 2 (torchrun stops the slower ones with SIGTERM once one has exited, then reports the failed
workers and exits 1: torchrun's own contract, which launch_torchrun.py exists to replace)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs/tiny.yaml")


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "pretrain/launch_torchrun.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("nproc, overrides, message", [
    ("3", ["parallel.tp=3"], "error: model.num_attention_heads=4 is not divisible by parallel.tp=3"),
    ("3", ["parallel.cp=2"], "error: world size 3 is not divisible by parallel.tp*parallel.pp*parallel.cp = 1*1*2"),
])
def test_launch_torchrun_refuses_a_bad_config_before_starting_torchrun(tmp_path, nproc, overrides, message):
    proc = launch("--nproc_per_node", nproc, str(REPO / "pretrain/pretrain_cplm.py"), "--config", TINY,
                  "--set", f"run.dir={tmp_path / 'run'}", *overrides, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_refused_config_is_printed_by_rank_0_only_and_every_rank_exits_2(monkeypatch, capsys, rank):
    from cplm_megatron.pretrain import main

    for key, value in {"RANK": rank, "WORLD_SIZE": "3", "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(key, value)
    assert main(["--config", TINY, "--set", "parallel.tp=3"]) == 2
    err = capsys.readouterr().err
    expected = ["error: model.num_attention_heads=4 is not divisible by parallel.tp=3"] if rank == "0" else []
    assert err.splitlines() == expected


@pytest.mark.slow
def test_plain_torchrun_shows_one_error_line_and_the_workers_exit_2(tmp_path):
    """Every worker finds the error before any collective and exits 2; torchrun stops the workers still running
    once the first has exited (SIGTERM, -15: a race between the workers' exits), so its root cause is exit 2."""
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "3", str(REPO / "pretrain/pretrain_cplm.py"),
                           "--config", TINY, "--set", "parallel.tp=3", f"run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    out = proc.stdout + proc.stderr
    assert [line for line in out.splitlines() if "error:" in line] == [
        "error: model.num_attention_heads=4 is not divisible by parallel.tp=3"], out
    assert "cplm_megatron" not in out  # no traceback of ours; what follows is torchrun's report of its workers
    codes = re.findall(r"exitcode\s*: (-?\d+)", out)
    assert proc.returncode == 1 and "exitcode  : 2" in out.split("Root Cause")[-1], out
    assert len(codes) >= 3 and set(codes) <= {"2", "-15"}, codes  # three workers, the root cause repeated
    assert not (tmp_path / "run").exists()
