"""Workers for the LM-head loss tests through the real model (run inside spawned processes).

Each worker builds the same model once per `model.lm_head_loss` from the same seed, on the same
batches, and records per-token losses, the first step's gradients and a few training steps."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

import torch

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.parallel.distributed import ParallelConfig
from tests.parallel.layouts import fixed_batches

SEED = 1234
SEQ_LEN = 32
COPY = {"heads": 2, "head_dim": 16, "impl": "chunked"}


def spread_batches(n: int, vocab: int) -> List[Dict[str, torch.Tensor]]:
    """layouts.fixed_batches (repeated spans, two documents, a padded tail) with the ids spread over the
    whole vocabulary (an injective map of the small alphabet), so every vocab shard owns targets."""
    out = []
    for batch in fixed_batches(n, 1, SEQ_LEN, vocab):
        spread = {k: (v * 997 + 13) % vocab if k in ("tokens", "labels") else v for k, v in batch.items()}
        out.append(spread)
    return out


def _build(model_cfg, copy: Optional[CopyHeadConfig], parallel: ParallelConfig, dtype: str):
    from cplm_megatron.model.builder import PrecisionConfig, build_run, model_run
    from cplm_megatron.parallel.distributed import set_seed
    from cplm_megatron.training.optimizer import (
        OptimizerConfig,
        ScheduleConfig,
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )
    from cplm_megatron.training.step import setup_model_config

    set_seed(SEED)  # identical initial weights for every implementation
    chunks = build_run(model_run(model_cfg, copy, parallel, PrecisionConfig(dtype=dtype), seq_len=256)).chunks
    opt_cfg = OptimizerConfig()
    chunks = wrap_ddp(chunks, opt_cfg, bf16=dtype == "bf16")
    optimizer = build_optimizer(chunks, opt_cfg, dtype, lr=1e-3, min_lr=1e-3)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), 10, lr=1e-3, min_lr=1e-3)
    setup_model_config(chunks, optimizer)
    return chunks, optimizer, scheduler


def _per_token(chunk, batch, with_copy: bool) -> Dict[str, torch.Tensor]:
    """Per-token outputs of one forward on a single-stage model: the loss and, with the head, -log p_LM."""
    model = chunk.module
    kw = dict(labels=batch["labels"], loss_mask=batch["loss_mask"], document_ids=batch["document_ids"])
    if with_copy:
        loss, out = model(batch["tokens"], batch["position_ids"], None, output="loss_and_copy", **kw)
        return {"loss": loss.detach(), "lm_ce": out.lm_ce.detach()}
    return {"loss": model(batch["tokens"], batch["position_ids"], None, **kw).detach()}


def compare(rank: int, parallel_kw: dict, with_copy: bool, impls: tuple, steps: int = 3, dtype: str = "fp32",
            n_micro: int = 4, model_overrides: Optional[dict] = None) -> Dict[str, dict]:
    """Per implementation: per-token outputs (single stage only), the first step's reduced gradients
    (main_grad of every parameter on this rank) and each step's loss and gradient norm."""
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.training.step import train_step

    parallel = ParallelConfig(**parallel_kw)
    copy = CopyHeadConfig(**COPY) if with_copy else None
    base = load_preset("tiny", **(model_overrides or {}))
    init_distributed(parallel, base, seed=SEED)
    batches = spread_batches(n_micro * steps, base.vocab_size)
    results = {}
    for impl in impls:
        chunks, optimizer, scheduler = _build(replace(base, lm_head_loss=impl), copy, parallel, dtype)
        record: dict = {"loss": [], "grad_norm": []}
        if parallel.pp == 1:
            record["per_token"] = _per_token(chunks[0], batches[0], with_copy)
        for step in range(steps):
            result = train_step(chunks, optimizer, scheduler, batches[step * n_micro:(step + 1) * n_micro],
                                SEQ_LEN, 1, document_masking=True)
            record["loss"].append(result.metrics["loss"])
            record["grad_norm"].append(result.grad_norm)
            if step == 0:
                record["grads"] = {f"{i}.{name}": p.main_grad.detach().float().clone()
                                   for i, chunk in enumerate(chunks) for name, p in chunk.module.named_parameters()}
        results[impl] = record
        del chunks, optimizer, scheduler
    return results
