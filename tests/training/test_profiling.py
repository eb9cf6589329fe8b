"""train.profile_steps: the profiler records exactly the asked iterations and writes their summary; bad ranges
are one ConfigError. (A whole training run with it: tests/model/test_compile.py's compiled recipe.)"""
import json

import pytest
import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import check_profile_steps
from cplm_megatron.training.profiling import StepProfiler


@pytest.mark.parametrize("steps", [[3], [0, 2], [5, 4], [1, 2, 3]])
def test_bad_profile_ranges_are_refused(steps):
    with pytest.raises(ConfigError, match=r"train.profile_steps must be \[first, last\]"):
        check_profile_steps(steps)


def test_only_the_asked_iterations_are_profiled_and_summarized(tmp_path):
    path = tmp_path / "profile.json"
    profiler = StepProfiler([2, 3], path)
    x = torch.randn(64, 64)
    for it in range(1, 6):
        profiler.begin(it)
        for _ in range(it):  # iteration i runs i matmuls and i adds
            x = torch.tanh(x @ x + 1)
        profiler.end(it)
    profiler.close()
    summary = json.loads(path.read_text())
    assert summary["iterations"] == [2, 3] and summary["steps"] == 2 and len(summary["step_s"]) == 2
    ops = {op["name"]: op["per_step"] for op in summary["top_cpu_ops"]}
    assert ops["aten::mm"] == 2.5 and ops["aten::tanh"] == 2.5  # (2 + 3) / 2: iterations 1, 4 and 5 left out
    assert summary["device"] == ("cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name())
    assert summary["compiled_regions_per_step"] == 0 and summary["cpu_ops_per_step"] >= 10


def test_a_rank_without_it_or_a_run_ending_early(tmp_path):
    quiet = StepProfiler([1, 2], tmp_path / "a.json", active=False)
    quiet.begin(1)
    quiet.end(1)
    quiet.close()
    early = StepProfiler([1, 4], tmp_path / "b.json")
    early.begin(1)
    torch.randn(8, 8).sum()
    early.end(1)
    early.close()  # the run ended at iteration 1: the profiled step is written
    assert not (tmp_path / "a.json").exists()
    assert json.loads((tmp_path / "b.json").read_text())["iterations"] == [1, 1]


def test_profile_steps_past_the_last_iteration_are_refused_with_one_line(tmp_path):
    """train.profile_steps=[10,20] with train.iters=4 trained and wrote no profile, silently: a launch refuses it
    before anything starts (exit 2, one line naming the range that fits), train.tokens runs too; a saved config
    holding such steps (a checkpoint written before) still reads."""
    import subprocess
    import sys

    from cplm_megatron.run_config import load_run_config, run_config_from_saved
    from tests.harness import REPO, process_env

    cfg = load_run_config("tiny", ["train.tokens=5000", "train.profile_steps=[2,20]"])
    with pytest.raises(ConfigError, match=r"\(train.tokens=5000: 3 iterations\): choose iterations within 1..3, "
                                          r"e.g. --set train.profile_steps=\[2,3\]"):
        cfg.validate_world(1)
    assert run_config_from_saved(cfg.to_dict()).train.profile_steps == [2, 20]
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cplm_megatron.pretrain", "--config", "tiny", "--set",
                           "train.iters=4", "train.profile_steps=[10,20]", f"run.dir={run_dir}"], cwd=REPO,
                          env=process_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr == ("error: train.profile_steps=[10, 20] goes past the run's last iteration (train.iters=4): "
                           "choose iterations within 1..4, e.g. --set train.profile_steps=[3,4]\n"), proc.stderr
    assert not run_dir.exists()
