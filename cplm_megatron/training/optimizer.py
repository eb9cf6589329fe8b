"""Megatron optimizer + LR/WD schedule from the `optimizer.*` and `schedule.*` config sections."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import OptimizerConfig, ScheduleConfig


def ddp_config(opt: OptimizerConfig, bf16: bool):
    """Megatron DistributedDataParallelConfig for this optimizer setup."""
    from megatron.core.distributed import DistributedDataParallelConfig

    kwargs = dict(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=opt.overlap_grad_reduce,
        overlap_param_gather=opt.overlap_param_gather,
        use_distributed_optimizer=opt.distributed,
        check_for_nan_in_grad=False,  # non-finite steps are skipped and counted by the trainer
    )
    if opt.bucket_size is not None:
        kwargs["bucket_size"] = opt.bucket_size
    return DistributedDataParallelConfig(**kwargs)


def wrap_ddp(chunks: List[torch.nn.Module], opt: OptimizerConfig, bf16: bool) -> List[torch.nn.Module]:
    """Wrap model chunks in Megatron-Core DDP (grad buffers, bucketed all-reduce/reduce-scatter)."""
    from megatron.core.distributed import DistributedDataParallel

    cfg = ddp_config(opt, bf16)
    return [
        DistributedDataParallel(config=chunk.config, ddp_config=cfg, module=chunk,
                                disable_bucketing=(i > 0))
        for i, chunk in enumerate(chunks)
    ]


def check_offload_supported(opt: OptimizerConfig) -> None:
    """CPU offload runs megatron-core's HybridDeviceOptimizer, which moves gradients and weights over
    CUDA streams, on its precision-aware optimizer path, whose config needs Transformer Engine installed
    (megatron-core 0.16.1 through main compare TE's version unconditionally)."""
    if not opt.offload_fraction:
        return
    import importlib.util

    if not torch.cuda.is_available() or importlib.util.find_spec("transformer_engine") is None:
        raise ConfigError("optimizer.offload_fraction > 0 (megatron-core's optimizer CPU offload) needs a CUDA GPU "
                          "and Transformer Engine; set optimizer.offload_fraction=0 here")


def megatron_optimizer_kwargs(opt: OptimizerConfig, dtype: str, lr: float, min_lr: float) -> dict:
    """Arguments of megatron-core's OptimizerConfig for this setup (Adam with decoupled weight decay).

    With ``offload_fraction`` > 0: ``optimizer_cpu_offload`` with that fraction, on the
    precision-aware optimizer path that Megatron-LM requires for it (the hybrid optimizer then owns
    the fp32 master weights: the offloaded share of master weights and moments leaves the GPU)."""
    kwargs = dict(
        optimizer="adam",
        lr=lr,
        min_lr=min_lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.beta1,
        adam_beta2=opt.beta2,
        adam_eps=opt.eps,
        clip_grad=opt.clip_grad,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        params_dtype={"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype],
        use_distributed_optimizer=opt.distributed,
        overlap_param_gather_with_optimizer_step=False,
    )
    if opt.offload_fraction:
        kwargs.update(optimizer_cpu_offload=True, optimizer_offload_fraction=opt.offload_fraction,
                      use_precision_aware_optimizer=True)
    return kwargs


def build_optimizer(chunks: List[torch.nn.Module], opt: OptimizerConfig, dtype: str, lr: float, min_lr: float):
    """Megatron optimizer (Adam with decoupled weight decay) over DDP-wrapped chunks; torch's AdamW fused per
    `optimizer.fused` where megatron-core uses it."""
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
    from megatron.core.optimizer import get_megatron_optimizer

    check_offload_supported(opt)
    cfg = MegatronOptimizerConfig(**megatron_optimizer_kwargs(opt, dtype, lr, min_lr))
    optimizer = get_megatron_optimizer(cfg, chunks)
    if not opt.offload_fraction:  # the hybrid CPU-offload optimizer picks its own kernels
        from cplm_megatron.entry_points import verbose
        from cplm_megatron.training.metrics_log import rank0_print

        kernel, fell_back = set_torch_adam_kernel(optimizer, fused_adam(opt))
        if verbose() or fell_back:
            rank0_print(f"[train] optimizer: {kernel}")
    return optimizer


def fused_adam(opt: OptimizerConfig) -> bool:
    """`optimizer.fused` resolved: auto is fused on CUDA."""
    return torch.cuda.is_available() if opt.fused == "auto" else bool(opt.fused)


def torch_adams(optimizer) -> List[torch.optim.Optimizer]:
    """The torch Adam/AdamW instances inside a Megatron optimizer (chained or not); none where megatron-core
    uses Apex's or Transformer Engine's FusedAdam."""
    inner = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    return [o for o in inner if type(o) in (torch.optim.Adam, torch.optim.AdamW)]


def fused_refusal(params: List[torch.Tensor]) -> Optional[str]:
    """Why this torch's fused AdamW cannot step `params` (the first line of its error), or None where it can: one
    fused step of torch's public AdamW on a two-element probe of each device and dtype among them (no private
    torch helper; torch checks the device at the step, not in the constructor)."""
    for device, dtype in sorted({(p.device, p.dtype) for p in params}, key=str):
        probe = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
        probe.grad = torch.ones_like(probe)
        try:
            torch.optim.AdamW([probe], fused=True).step()
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as err:
            text = str(err).strip()
            return f"{device.type} {dtype}: {text.splitlines()[0] if text else type(err).__name__}"
    return None


def set_torch_adam_kernel(optimizer, fused: bool) -> Tuple[str, bool]:
    """Run megatron-core's torch AdamW with the fused kernel (or torch's default choice: foreach on CUDA, a loop on
    CPU), as if it had been built with `fused=`; where torch refuses the fused kernel for these parameters, its
    default kernel instead. A checkpoint's optimizer state loads into the kernel in use (its saved setting and
    step-counter placement do not carry over). Returns what runs (for the log) and whether that is a fallback."""
    adams = torch_adams(optimizer)
    refusal = fused_refusal([p for a in adams for g in a.param_groups for p in g["params"]]) if fused else None
    fused = fused and refusal is None
    for adam in adams:
        for group in [adam.defaults, *adam.param_groups]:
            group["fused"], group["foreach"] = (True, False) if fused else (None, None)
        if not getattr(adam, "_cplm_keeps_kernel", False):
            adam.register_load_state_dict_pre_hook(_keep_kernel)
            adam._cplm_keeps_kernel = True
    if not adams:
        return ("Apex/Transformer Engine FusedAdam" if optimizer is not None else "none"), False
    if refusal is not None:
        return (f"optimizer.fused: torch {torch.__version__} refuses the fused AdamW here ({refusal}); torch's "
                f"default kernel instead"), True
    return ("torch AdamW, fused" if fused else "torch AdamW, torch's default kernel"), False


def _keep_kernel(adam: torch.optim.Optimizer, state_dict: dict) -> dict:
    """load_state_dict pre-hook: the saved param groups take this optimizer's kernel flags, so torch places each
    `step` counter where that kernel needs it (fused: a float32 tensor on the parameter's device)."""
    groups = [{**saved, "fused": now["fused"], "foreach": now["foreach"]}
              for saved, now in zip(state_dict["param_groups"], adam.param_groups)]
    return {**state_dict, "param_groups": groups}


def build_scheduler(optimizer, opt: OptimizerConfig, sched: ScheduleConfig, train_iters: int, lr: float,
                    min_lr: float):
    """Megatron's OptimizerParamScheduler (stepped once per iteration)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    decay_iters = sched.decay_iters or train_iters
    style = sched.style
    kwargs = {}
    if style == "wsd":
        kwargs = dict(wsd_decay_steps=max(1, int(round(sched.wsd_decay_fraction * train_iters))),
                      lr_wsd_decay_style=sched.wsd_decay_style)
        style = "WSD"
    return OptimizerParamScheduler(
        optimizer,
        # linear warmup from lr / warmup_iters: the first step already learns (init 0 would waste it)
        init_lr=lr / sched.warmup_iters if sched.warmup_iters else lr,
        max_lr=lr,
        min_lr=min_lr,
        lr_warmup_steps=sched.warmup_iters,
        lr_decay_steps=max(decay_iters, sched.warmup_iters + 1),
        lr_decay_style=style,
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=max(1, train_iters),
        wd_incr_style="constant",
        # resuming with a changed schedule (train.iters, lr, schedule.*) follows the new values
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
        **kwargs,
    )
