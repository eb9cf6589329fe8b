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
