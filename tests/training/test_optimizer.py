"""`optimizer.offload_fraction`: validation, the megatron-core arguments it turns into, and the clear error
where megatron-core's CPU offload cannot run (no CUDA GPU or no Transformer Engine, e.g. this CPU machine).

What is not verified here: the offloaded step itself. megatron-core's HybridDeviceOptimizer moves
gradients and weights over CUDA streams and its precision-aware path needs Transformer Engine, so it
cannot run on a CPU-only machine (see the README's verification table)."""
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import load_run_config
from cplm_megatron.training.optimizer import (
    OptimizerConfig,
    check_offload_supported,
    megatron_optimizer_kwargs,
)
from tests.training import pretrain_utils as pu

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

REPO = Path(__file__).resolve().parents[2]
OFFLOAD_RUNS_HERE = torch.cuda.is_available() and importlib.util.find_spec("transformer_engine") is not None


@pytest.mark.parametrize("overrides, message", [
    (["optimizer.offload_fraction=1.5", "optimizer.distributed=true"], "must be in \\[0, 1\\]"),
    (["optimizer.offload_fraction=0.5"], "set optimizer.distributed=true"),
])
def test_bad_offload_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(REPO / "configs" / "tiny.yaml", overrides)


def test_offload_fraction_reaches_megatron_core_optimizer_config():
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig

    fields = {f.name for f in dataclasses.fields(MegatronOptimizerConfig)}
    plain = megatron_optimizer_kwargs(OptimizerConfig(distributed=True), "bf16", 1e-3, 1e-4)
    assert "optimizer_cpu_offload" not in plain and set(plain) <= fields
    kwargs = megatron_optimizer_kwargs(OptimizerConfig(distributed=True, offload_fraction=0.25), "bf16", 1e-3, 1e-4)
    assert set(kwargs) <= fields  # every name is a field of this megatron-core's config
    assert kwargs["optimizer_cpu_offload"] is True and kwargs["optimizer_offload_fraction"] == 0.25
    assert kwargs["use_precision_aware_optimizer"] and kwargs["use_distributed_optimizer"]
    assert {k: v for k, v in kwargs.items() if k in plain} == plain


@pytest.mark.skipif(OFFLOAD_RUNS_HERE, reason="this machine has CUDA and Transformer Engine: offload can run")
def test_offload_without_gpu_and_te_is_refused_with_the_fix():
    check_offload_supported(OptimizerConfig(distributed=True))  # no offload: nothing to check
    with pytest.raises(ConfigError, match="needs a CUDA GPU and Transformer Engine; set optimizer.offload_fraction=0"):
        check_offload_supported(OptimizerConfig(distributed=True, offload_fraction=0.5))


@pytest.mark.slow
@pytest.mark.skipif(OFFLOAD_RUNS_HERE, reason="this machine has CUDA and Transformer Engine: offload can run")
def test_training_entry_point_exits_2_on_offload_here(tmp_path):
    proc = pu.run(1, [f"run.dir={tmp_path / 'run'}", "train.iters=1", "optimizer.distributed=true",
                      "optimizer.offload_fraction=0.5", "logging.wandb=false", "data.synthetic=copy"])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "optimizer.offload_fraction" in proc.stderr and "Transformer Engine" in proc.stderr


@pytest.mark.parametrize("value, want", [("auto", "auto"), ("true", True), ("false", False)])
def test_optimizer_fused_setting(value, want):
    cfg = load_run_config(REPO / "configs" / "tiny.yaml", [f"optimizer.fused={value}"])
    assert cfg.optimizer.fused == want
    with pytest.raises(ConfigError, match="optimizer.fused"):
        load_run_config(REPO / "configs" / "tiny.yaml", ["optimizer.fused=sometimes"])


@pytest.mark.slow
@pytest.mark.parametrize("dtype, distributed", [("fp32", False), ("bf16", True)])
def test_fused_adamw_matches_torch_default_straight_and_across_a_checkpoint(tmp_path, dtype, distributed):
    """megatron-core's torch AdamW run with torch's fused kernel (optimizer.fused=true) makes the update its
    default kernel makes (a per-parameter loop on CPU), and a checkpoint saved with one kernel resumes with the
    other: the fused flags stay, the step counters come back as the fused kernel needs them. Each comparison is
    one step from the same weights, moments and gradients."""
    from tests.harness import run_distributed
    from tests.training.optimizer_workers import LR, kernels_agree

    [r] = run_distributed(kernels_agree, 1, str(tmp_path), dtype, distributed)
    assert "_fused_adamw_" in r["fused_calls"] and "_fused_adamw_" not in r["default_calls"], r
    assert r["restored_flags"] == [(True, False)]
    assert r["restored_steps"] == [(1.0, torch.float32, "cpu")]
    eps = torch.finfo(torch.float32).eps
    for name, step in (("fused", 0), ("resumed", 1)):
        for want, got in zip(r["default"][step], r[name]):
            # each kernel rounds the decay, the update (m / (sqrt(v) + eps): no cancellation, a few ulps) and the
            # subtraction from p on its own: <= 4 ulps of max(|p|) + lr
            tol = 4 * eps * (float(want.abs().max()) + LR)
            assert float((want - got).abs().max()) <= tol, (name, float((want - got).abs().max()), tol)


def test_fused_adamw_falls_back_in_one_line_where_torch_refuses_it():
    """`optimizer.fused` asks torch's own AdamW constructor (public API, no private helper) whether the fused kernel
    runs these parameters: CPU floats run fused (the CUDA default exercised here); parameters torch refuses (the
    meta device is on no fused-kernel list) fall back to torch's default kernel with one line saying why.
    The helper this once imported (torch.optim.optimizer._device_dtype_check_for_fused) and the fused AdamW path are
    the same in torch 2.11.0 (the GPU image's) as in 2.13.0, read from both wheels."""
    from types import SimpleNamespace

    from cplm_megatron.training.optimizer import fused_refusal, set_torch_adam_kernel

    cpu = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    assert fused_refusal(cpu.param_groups[0]["params"]) is None
    assert set_torch_adam_kernel(SimpleNamespace(optimizer=cpu), True) == ("torch AdamW, fused", False)
    assert (cpu.param_groups[0]["fused"], cpu.param_groups[0]["foreach"]) == (True, False)
    meta = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, device="meta"))])
    line, fell_back = set_torch_adam_kernel(SimpleNamespace(optimizer=meta), True)
    assert fell_back and "\n" not in line and f"torch {torch.__version__} refuses the fused AdamW" in line
    assert "supported devices" in line and line.endswith("torch's default kernel instead")
    assert (meta.param_groups[0]["fused"], meta.param_groups[0]["foreach"]) == (None, None)
