"""The megatron-core patch layer: every patch is needed on the installed megatron-core (its scenario fails
without it, in fresh processes: tests/harness.py) or, where that megatron-core lacks the code it fixes, not applied; all
scenarios pass with the layer; nothing CPU-only is applied when CUDA is present; rank 0 logs what was
applied; and a job that was promised GPUs but has no CUDA stops instead of training on CPU."""
import pytest
import torch

from cplm_megatron.errors import UserError
from cplm_megatron.parallel.megatron_patches import PATCHES, SCOPES, check_cuda_expected, gpus_expected
from tests.harness import run_distributed
from tests.parallel.compat_scenarios import run_scenario
from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.mcore_latest]  # where releases differ: every test on both legs

BY_NAME = {p.name: p for p in PATCHES}

# patch -> (scenario that needs it, what goes wrong without it)
NEEDED_BY = {
    "rng_tracker": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "current_device": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "cuda_placement": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "synchronize": ("pipeline_parallel", "Torch not compiled with CUDA enabled"),
    "missing_state_keys": ("distopt_resume", "KeyError: 'step'"),
    "shared_step": ("distopt_resume", "share one Adam `step` tensor"),
    "sp_norm": ("sequence_parallel", "sequence parallel not supported by torch LayerNorm"),
    "grad_norm_precision": ("grad_norm_precision", "AssertionError"),
    "current_stream": ("train_step_single", "current_stream = torch.cuda.current_stream()"),  # mcore >= 0.18.2
    "tp_group_warning": ("compile_layer", "graph break(s)"),
    "foreach_fallback": ("foreach_fallback", "per-tensor torch calls"),
    "results_queue": ("results_queue", "imported torch"),
}


def _applied(rank: int, claims_cuda: bool) -> tuple[list[str], str]:
    from cplm_megatron.parallel import megatron_patches as c

    if claims_cuda:
        torch.cuda.is_available = lambda: True  # what a GPU machine reports (selection logic only)
    a = c.apply_compat()
    assert c.apply_compat() == a
    return a, c.describe_compat(a)


def applied_in_fresh_process(claims_cuda: bool = False) -> tuple[list[str], str]:
    """(apply_compat()'s names, describe_compat()'s line) in a fresh process (where CUDA is claimed if asked)."""
    [result] = run_distributed(_applied, 1, claims_cuda, compat=False)  # the worker applies nothing first
    return result


def test_every_patch_has_a_scenario():
    assert set(NEEDED_BY) == {p.name for p in PATCHES}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({s for s, _ in NEEDED_BY.values()}))
def test_scenarios_pass_with_the_layer(name):
    proc = run_scenario(name, verbose=name == "pipeline_parallel")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    if name == "pipeline_parallel":  # 2 ranks, verbose: the applied patches are logged once, by rank 0
        assert proc.stderr.count("[compat] megatron-core ") == 1, proc.stderr[-4000:]
        assert f"{SCOPES['cpu']}: rng_tracker, current_device" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("patch", sorted(NEEDED_BY))
def test_each_patch_is_needed(patch):
    name, symptom = NEEDED_BY[patch]
    if not BY_NAME[patch].needed():
        # this megatron-core lacks the code the patch replaces: it must not be applied (and `name`
        # passes without it in test_scenarios_pass_with_the_layer)
        assert patch not in applied_in_fresh_process()[0]
        return
    proc = run_scenario(name, skip=patch)
    assert proc.returncode != 0, f"{name} passed without the {patch} patch"
    assert symptom in proc.stdout + proc.stderr, proc.stderr[-4000:]


@pytest.mark.slow
def test_gpu_machines_without_apex_te_get_only_the_torch_fallback_fixes():
    """The path of a GPU install without Apex/TE (the H200 image): selection and log line."""
    applied, line = applied_in_fresh_process(claims_cuda=True)
    assert set(applied) == {p.name for p in PATCHES if p.scope == "torch_fallback"}  # no Apex/TE installed here
    assert f"{SCOPES['torch_fallback']}: missing_state_keys, shared_step, sp_norm, tp_group_warning, " \
           "foreach_fallback" in line
    assert SCOPES["cpu"] not in line


def _idempotent(rank: int) -> str:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D

    from cplm_megatron.parallel import megatron_patches as c

    a = c.apply_compat()
    f = D.load_state_dict
    b = c.apply_compat()
    assert a == b and D.load_state_dict is f, "patched twice"
    with pytest.raises(ValueError) as e:
        c.apply_compat(skip=["nope"])
    return str(e.value)


@pytest.mark.slow
def test_apply_is_idempotent_and_rejects_unknown_names():
    [message] = run_distributed(_idempotent, 1, compat=False)
    assert "unknown compat patch(es) ['nope']" in message


def test_gpus_expected_reads_the_launcher_variables():
    assert gpus_expected({}) == {}
    assert gpus_expected({"CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "0"}) == {}  # GPUs hidden / none
    assert gpus_expected({"CUDA_VISIBLE_DEVICES": "-1"}) == {}
    assert gpus_expected({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1", "SLURM_GPUS_ON_NODE": "2"}) == {
        "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1", "SLURM_GPUS_ON_NODE": "2"}


def test_promised_gpus_without_cuda_are_an_error_unless_allowed():
    check_cuda_expected({})  # nothing promised: the CPU path is fine
    check_cuda_expected({"SLURM_GPUS_ON_NODE": "8", "CPLM_ALLOW_CPU": "1"})  # the explicit opt-out
    with pytest.raises(UserError, match=r"SLURM_GPUS_ON_NODE=8\) but CUDA is unavailable: this torch is a CPU build"):
        check_cuda_expected({"SLURM_GPUS_ON_NODE": "8"})


@pytest.mark.slow
def test_training_stops_with_exit_2_when_gpus_are_promised_but_cuda_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("CPLM_ALLOW_CPU", raising=False)
    proc = pu.run(1, [f"run.dir={tmp_path}", "data.synthetic=copy"],
                  extra_env={"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "0,1"})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "GPUs are expected here (CUDA_VISIBLE_DEVICES=0,1, SLURM_JOB_GPUS=0,1)" in error
    assert "set CPLM_ALLOW_CPU=1" in error
    assert not (tmp_path / "checkpoints").exists()


def _groups_without_the_layer(rank: int) -> tuple[str, list]:
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel import megatron_patches as c
    from cplm_megatron.parallel.config import ParallelConfig

    with pytest.raises(RuntimeError) as e:
        init_distributed(ParallelConfig(), ModelConfig())
    return str(e.value), list(c._APPLIED)


@pytest.mark.slow
def test_the_entry_points_apply_the_layer_not_init_process_groups():
    """A process whose entry point did not apply the layer cannot create process groups (one error naming
    the fix, nothing patched); an entry point (tools/model_info.py's main, in a process that applied nothing
    before it) applies it and rank 0 logs it once where verbose (CPLM_VERBOSE=1), not otherwise."""
    from tests.harness import _tool_main, run_captured

    [(message, applied)] = run_distributed(_groups_without_the_layer, 1, compat=False)
    assert "setup_compat() in the entry point" in message and applied == [], (message, applied)
    out = run_captured(_tool_main, 1, "model_info", ("--preset", "tiny", "--json"), env={"CPLM_VERBOSE": "1"},
                       compat=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("[compat] megatron-core ") == 1, out.stderr[-3000:]
    assert f"{SCOPES['cpu']}: rng_tracker, current_device" in out.stderr


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the device tensors read back to the host (each a device synchronization on a GPU): `float(t)`,
    `t.item()`, `t.tolist()`, and every tensor element of `torch.tensor([...])`."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__float__, torch.Tensor.item, torch.Tensor.tolist):
            self.reads += 1
        elif func is torch.tensor:
            self.reads += sum(1 for x in _flatten(args[0]) if isinstance(x, torch.Tensor))
        return func(*args, **(kwargs or {}))


def _flatten(data):
    if isinstance(data, (list, tuple)):
        for x in data:
            yield from _flatten(x)
    else:
        yield data


def test_foreach_grad_norm_reads_nothing_back_and_matches_megatron_core():
    """The GPU path's grad norm (foreach_fallback; on CPU grad_norm_precision's fp64 norm is used instead):
    megatron-core's local norm reads each tensor's norm back to the host, the replacement none."""
    from megatron.core.utils import local_multi_tensor_l2_norm

    from cplm_megatron.parallel.megatron_patches import foreach_l2_norm

    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(64, 32, generator=g) * 10 ** (i % 3) for i in range(12)]
    flag = torch.zeros(1, dtype=torch.int)
    with _HostReads() as megatron_reads:
        want, _ = local_multi_tensor_l2_norm(2048, flag, [grads], False)
    with _HostReads() as ours:
        got, none = foreach_l2_norm(2048, flag, [grads], False)
    assert megatron_reads.reads == len(grads) + 1 and ours.reads == 0 and none is None
    exact = torch.sqrt(sum(t.double().pow(2).sum() for t in grads))
    # fp32 sums of 2048 squares per tensor (relative error <= ~2048 * 2^-24 ~ 1.2e-4 bound, ~1e-6 typical)
    assert got.shape == (1,) and abs(float(got) - float(exact)) <= 1.2e-4 * float(exact)
    assert abs(float(got) - float(want)) <= 1.2e-4 * float(exact)
    assert float(foreach_l2_norm(2048, flag, [[]], False)[0]) == 0.0
