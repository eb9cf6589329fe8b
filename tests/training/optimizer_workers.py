"""Workers of the optimizer-kernel tests (one warm process: tests/harness.py): megatron-core's torch AdamW with
torch's default kernel (a per-parameter loop on CPU) against the fused kernel, straight and across a checkpoint."""
from __future__ import annotations

import os
from typing import Dict, List

import torch

LR = 1e-3
STEPS = 2


class _Calls(torch.overrides.TorchFunctionMode):
    """The names of the torch functions called from Python."""

    def __init__(self):
        super().__init__()
        self.names: set = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def _build(fused: bool, dtype: str, distributed: bool):
    """The tiny model (its initial weights from the parallel state's seed) with megatron-core's optimizer."""
    from cplm_megatron.model.builder import PrecisionConfig, build_run, model_run
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig
    from cplm_megatron.training.optimizer import (
        OptimizerConfig,
        ScheduleConfig,
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )
    from cplm_megatron.training.step import setup_model_config

    model = load_preset("tiny")
    layout = init_distributed(ParallelConfig(), model, seed=1234)
    chunks = build_run(model_run(model, precision=PrecisionConfig(dtype=dtype), seq_len=32), layout).chunks
    opt_cfg = OptimizerConfig(distributed=distributed, fused=fused)
    chunks = wrap_ddp(chunks, opt_cfg, bf16=dtype == "bf16")
    optimizer = build_optimizer(chunks, opt_cfg, dtype, lr=LR, min_lr=LR)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), 10, lr=LR, min_lr=LR)
    setup_model_config(chunks, optimizer)
    return model, chunks, optimizer, scheduler


def _main_params(optimizer) -> List[torch.Tensor]:
    """The fp32 parameters the optimizer updates (main params of a 16-bit model, the model's own in fp32)."""
    from cplm_megatron.training.optimizer import torch_adams

    return [p.detach().clone() for adam in torch_adams(optimizer) for g in adam.param_groups for p in g["params"]]


def _steps(chunks, optimizer, scheduler, vocab: int, first: int, last: int) -> set:
    """Training steps first..last-1 on fixed batches; the names of the torch functions they called."""
    from cplm_megatron.training.step import train_step
    from tests.parallel.layouts import fixed_batches

    batches = fixed_batches(2 * STEPS, 1, 32, vocab)
    with _Calls() as calls:
        for i in range(first, last):
            train_step(chunks, optimizer, scheduler, batches[2 * i:2 * i + 2], 32, 1)
    return calls.names


def kernels_agree(rank: int, root: str, dtype: str, distributed: bool) -> Dict:
    """From the same weights: torch's default kernel for STEPS steps (its fp32 parameters after each), the fused
    kernel for one step, and one default step + a checkpoint + one fused step; which Adam kernels ran, and the
    resumed optimizer's flags and step counters."""
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.checkpoint.lookup import read_latest
    from cplm_megatron.training.optimizer import torch_adams
    from tests.harness import _reset_megatron

    out: Dict = {"default": []}
    model, chunks, optimizer, scheduler = _build(False, dtype, distributed)
    for step in range(STEPS):
        out["default_calls"] = _adam_calls(_steps(chunks, optimizer, scheduler, model.vocab_size, step, step + 1))
        out["default"].append(_main_params(optimizer))
        if step == 0:
            ckpt = Checkpointer(os.path.join(root, f"ckpt_{dtype}_{distributed}"))
            ckpt.save(chunks, optimizer, scheduler, TrainState(iteration=1), None, {})
    _reset_megatron()
    model, chunks, optimizer, scheduler = _build(True, dtype, distributed)
    out["fused_calls"] = _adam_calls(_steps(chunks, optimizer, scheduler, model.vocab_size, 0, 1))
    out["fused"] = _main_params(optimizer)
    _reset_megatron()
    model, chunks, optimizer, scheduler = _build(True, dtype, distributed)
    ckpt.load(read_latest(ckpt.root), chunks, optimizer, scheduler)
    adams = torch_adams(optimizer)
    out["restored_flags"] = sorted({(g["fused"], g["foreach"]) for a in adams for g in a.param_groups})
    out["restored_steps"] = sorted({(float(s["step"]), s["step"].dtype, s["step"].device.type)
                                    for a in adams for s in a.state.values()}, key=str)
    _steps(chunks, optimizer, scheduler, model.vocab_size, 1, 2)
    out["resumed"] = _main_params(optimizer)
    _reset_megatron()
    return out


def _adam_calls(names: set) -> List[str]:
    return sorted(n for n in names if "adam" in n.lower())
