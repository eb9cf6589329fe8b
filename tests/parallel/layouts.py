"""Worker functions shared by the layout-equivalence tests (run inside spawned processes)."""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.parallel.distributed import ParallelConfig


def fixed_batches(n: int, micro_batch: int, seq_len: int, vocab: int, seed: int = 0, docs: bool = True,
                  repeat: bool = True) -> List[Dict[str, torch.Tensor]]:
    """Deterministic micro-batches; repeated spans so the copy head has matches; a few documents."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        toks = torch.randint(0, min(vocab, 64) if repeat else vocab, (micro_batch, seq_len + 1), generator=g)
        loss_mask = torch.ones(micro_batch, seq_len)
        loss_mask[:, -3:] = 0  # padded tail
        doc = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        if docs:
            doc[:, seq_len // 2:] = 1
        pos = torch.arange(seq_len)[None].repeat(micro_batch, 1)
        out.append(dict(tokens=toks[:, :-1], labels=toks[:, 1:], loss_mask=loss_mask, position_ids=pos,
                        document_ids=doc))
    return out


def build(parallel: ParallelConfig, preset: str = "tiny", copy: Optional[CopyHeadConfig] = None,
          distributed_optimizer: bool = False, seed: int = 1234, **model_overrides):
    """init_distributed + model + DDP + optimizer + scheduler for one process."""
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.training.optimizer import (
        OptimizerConfig,
        ScheduleConfig,
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )
    from cplm_megatron.training.step import setup_model_config

    model_cfg = load_preset(preset, **model_overrides)
    layout = init_distributed(parallel, model_cfg, seed=seed)
    chunks = build_run(model_run(model_cfg, copy, parallel, seq_len=256), layout).chunks
    opt_cfg = OptimizerConfig(distributed=distributed_optimizer)
    chunks = wrap_ddp(chunks, opt_cfg, bf16=False)
    optimizer = build_optimizer(chunks, opt_cfg, "fp32", lr=1e-3, min_lr=1e-3)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), 10, lr=1e-3, min_lr=1e-3)
    setup_model_config(chunks, optimizer)
    return layout, model_cfg, chunks, optimizer, scheduler


def one_step(rank: int, parallel_kw: dict, init_dir: str, out_dir: Optional[str], copy_kw: Optional[dict],
             n_micro: int = 4, save_init: bool = False, distributed_optimizer: bool = False,
             preset: str = "tiny", document_masking: bool = True, seq_len: int = 32) -> Dict:
    """Load (or save) initial weights, run one train step on this DP rank's share of the fixed batch."""
    from cplm_megatron.checkpoint.weights import load_weights, save_weights
    from cplm_megatron.training.step import train_step

    parallel = ParallelConfig(**parallel_kw)
    copy = CopyHeadConfig(**copy_kw) if copy_kw is not None else None
    layout, model_cfg, chunks, optimizer, scheduler = build(parallel, preset, copy, distributed_optimizer)
    if save_init:
        save_weights(chunks, init_dir)
    else:
        load_weights(chunks, init_dir)
    batches = fixed_batches(n_micro, 1, seq_len, model_cfg.vocab_size)
    per_rank = n_micro // layout.dp
    mine = batches[layout.dp_rank * per_rank:(layout.dp_rank + 1) * per_rank]
    result = train_step(chunks, optimizer, scheduler, mine, seq_len, 1, document_masking=document_masking)
    head_grads = {}
    if not distributed_optimizer:  # main_grad holds the full reduced gradient
        for chunk in chunks:
            for name, p in chunk.module.named_parameters():
                if name.startswith("copy_head."):
                    head_grads[name] = p.main_grad.detach().clone()
    if out_dir:
        save_weights(chunks, out_dir)
    return {"metrics": result.metrics, "grad_norm": result.grad_norm, "head_grads": head_grads,
            "layout": (layout.tp, layout.pp, layout.dp)}
