"""tests/harness.py, the one launcher: warm processes are real, separate processes (own pid, environment,
parallel state, exit code, signals), cases of one group start from a clean megatron parallel state, and
failures come back as errors or outcomes, never as a hang."""
import os
import signal

import pytest

from tests import harness

pytestmark = pytest.mark.mcore


def _identity(rank: int, key: str) -> dict:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig

    before = ps.model_parallel_is_initialized()
    layout = init_distributed(ParallelConfig(tp=2), load_preset("tiny"))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return {"pid": os.getpid(), "env": os.environ.get(key), "threads": torch.get_num_threads(),
            "initialized_before": before, "tp_rank": layout.tp_rank, "sum": total.item()}


def _fails_on_rank_1(rank: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 says no")
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")
    dist.barrier()  # would wait forever for rank 1: the harness must stop it


def _exits(rank: int, code: int) -> None:
    print(f"rank {rank} exiting with {code}", flush=True)
    os._exit(code)


def test_cases_run_in_separate_processes_with_a_fresh_parallel_state_each():
    results = harness.run_cases([harness.Call("a", _identity, ("CPLM_HARNESS_PROBE",)),
                                 harness.Call("b", _identity, ("CPLM_HARNESS_PROBE",))], 2,
                                env={"CPLM_HARNESS_PROBE": "yes"})
    first, second = results["a"], results["b"]
    assert {r["pid"] for r in first} == {r["pid"] for r in second} and len({r["pid"] for r in first}) == 2
    assert os.getpid() not in {r["pid"] for r in first}
    assert [r["tp_rank"] for r in first] == [0, 1] and all(r["sum"] == 3.0 for r in first + second)
    assert not any(r["initialized_before"] for r in first + second)  # megatron's state torn down between cases
    assert all(r["env"] == "yes" and r["threads"] == 1 for r in first + second)


def test_a_failing_rank_raises_with_its_error_and_stops_the_others():
    with pytest.raises(RuntimeError, match="rank 1, case call: ValueError: rank 1 says no"):
        harness.run_distributed(_fails_on_rank_1, 2)


def test_captured_outcome_has_the_exit_code_and_the_output():
    out = harness.run_captured(_exits, 1, 3)
    assert out.returncode == 3 and "rank 0 exiting with 3" in out.stdout and out.results is None


def test_a_warm_pretrain_run_is_killed_and_reports_the_signal(tmp_path):
    run = harness.start_pretrain(1, [f"run.dir={tmp_path / 'run'}", "data.synthetic=copy", "train.iters=100000",
                                     "logging.wandb=false", "checkpoint.enabled=false"], tmp_path / "log")
    assert run.poll() is None
    harness.kill_group(run, signal.SIGKILL)
    assert run.wait(timeout=60) == -signal.SIGKILL
