"""One optimizer step (or one evaluation pass) over a global batch with Megatron's schedules.

The global batch is `num_microbatches` micro-batches per data-parallel rank. All ranks read the same
number of micro-batches per step (TP/PP peers get identical ones), so data state stays aligned; the
micro-batches are replayed to every virtual-pipeline chunk. Losses are per-token sums and the
gradients are normalized by the global token count (`calculate_per_token_loss`), so the loss is the
same for every layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Dict, Iterable, List, Optional

import torch
import torch.distributed as dist

from cplm_megatron.model.inputs import model_inputs


def loss_func(loss_mask: torch.Tensor, names: tuple, copy_out, output_tensor: torch.Tensor):
    """Megatron loss_func: (sum of masked per-token loss, token count, the masked sums of the model's
    `names` for logging: the loss, then the copy head's per-token quantities, or for a baseline its loss as
    the LM head's and the full distribution's NLL)."""
    mask = loss_mask.float().reshape(-1)
    losses = output_tensor.float().reshape(-1)
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    per_token = copy_out.metrics() if copy_out is not None else {"lm_loss": losses, "mix_loss": losses}
    sums = [loss_sum.detach()] + [torch.sum(per_token[k].float().reshape(-1) * mask).detach() for k in names[1:]]
    report = torch.stack([s.to(mask.device) for s in sums] + [mask.sum()])
    return loss_sum, num_tokens, {"sums": report}


def metric_names(model) -> tuple:
    """The per-token quantities `model` (a chunk, wrapped or not) reports (CPLMGPTModel.metric_names)."""
    from megatron.core.utils import get_attr_wrapped_model

    return get_attr_wrapped_model(model, "metric_names")()


def forward_step(document_masking: bool, data_iterator, model):
    """Megatron forward_step_func: returns (output tensor, loss function)."""
    batch = next(data_iterator)
    device = next(model.parameters()).device
    inputs = model_inputs(batch, device, document_masking)
    out = model(**inputs, output="loss_and_copy")
    if isinstance(out, tuple):
        loss, copy_out = out
    else:
        loss, copy_out = out, None
    return loss, partial(loss_func, inputs["loss_mask"], metric_names(model), copy_out)


def _reduce_metrics(losses_reduced: List[Dict], device: torch.device, names: tuple) -> Dict[str, float]:
    """Sum micro-batch reports, all-reduce over data parallel, share from the last stage with all ranks."""
    from megatron.core import parallel_state as ps

    n = len(names) + 1
    total = torch.zeros(n, dtype=torch.float64, device=device)
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        for item in losses_reduced:
            total += item["sums"].to(total)
        # data and context parallel ranks hold disjoint tokens: sum over both
        dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
        if ps.get_tensor_model_parallel_rank() != 0 or ps.get_data_parallel_rank(with_context_parallel=True) != 0:
            total.zero_()
    else:
        total.zero_()
    dist.all_reduce(total)  # exactly one contributor: last stage, tp 0, dp-cp 0
    tokens = float(total[-1])
    out = {k: float(total[i]) / max(tokens, 1.0) for i, k in enumerate(names)}
    out["tokens"] = tokens
    return out


@dataclass
class StepResult:
    """What one training step reports."""

    metrics: Dict[str, float]
    grad_norm: Optional[float]
    lr: float
    skipped: bool


def train_step(
    chunks: List[torch.nn.Module],
    optimizer,
    scheduler,
    batches: List[Dict[str, torch.Tensor]],
    seq_len: int,
    micro_batch: int,
    document_masking: bool = False,
) -> StepResult:
    """Forward/backward over `batches` (this DP rank's micro-batches), then one optimizer step.

    A step whose loss is not finite is skipped (no update, scheduler not advanced).
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    iterators = _iterators(batches, len(chunks))
    losses = get_forward_backward_func()(
        forward_step_func=partial(forward_step, document_masking),
        data_iterator=iterators,
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(batches),
        seq_length=seq_len,
        micro_batch_size=micro_batch,
        forward_only=False,
    )
    device = next(chunks[0].parameters()).device
    metrics = _reduce_metrics(losses, device, metric_names(chunks[0]))
    lr = optimizer.param_groups[0]["lr"]
    if not math.isfinite(metrics["loss"]):
        optimizer.zero_grad()
        return StepResult(metrics, None, lr, skipped=True)
    ok, grad_norm, _ = optimizer.step()
    if not ok:  # fp16 loss-scale overflow
        return StepResult(metrics, grad_norm, lr, skipped=True)
    scheduler.step(increment=1)
    return StepResult(metrics, float(grad_norm) if grad_norm is not None else None, lr, skipped=False)


@torch.no_grad()
def eval_step(
    chunks: List[torch.nn.Module],
    batches: List[Dict[str, torch.Tensor]],
    seq_len: int,
    micro_batch: int,
    document_masking: bool = False,
) -> Dict[str, float]:
    """Forward-only pass over `batches`; token-weighted metrics on every rank."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    for chunk in chunks:
        chunk.eval()
    try:
        losses = get_forward_backward_func()(
            forward_step_func=partial(forward_step, document_masking),
            data_iterator=_iterators(batches, len(chunks)),
            model=chunks if len(chunks) > 1 else chunks[0],
            num_microbatches=len(batches),
            seq_length=seq_len,
            micro_batch_size=micro_batch,
            forward_only=True,
        )
    finally:
        for chunk in chunks:
            chunk.train()
    return _reduce_metrics(losses, next(chunks[0].parameters()).device, metric_names(chunks[0]))


def _iterators(batches: List[Dict[str, torch.Tensor]], n_chunks: int):
    """One iterator over the same micro-batches per virtual-pipeline chunk."""
    if n_chunks == 1:
        return iter(batches)
    return [iter(batches) for _ in range(n_chunks)]


def setup_model_config(chunks: List[torch.nn.Module], optimizer) -> None:
    """Wire Megatron's schedule hooks (grad scaling, grad finalization, DDP no-sync) into the config."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    config = get_model_config(chunks[0])
    config.calculate_per_token_loss = True
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    ddp = chunks[0].ddp_config
    if ddp.overlap_grad_reduce:
        no_sync = [c.no_sync for c in chunks]
        config.no_sync_func = no_sync[0] if len(chunks) == 1 else no_sync
    if ddp.overlap_param_gather:
        param_sync = [c.start_param_sync for c in chunks]
        config.param_sync_func = param_sync[0] if len(chunks) == 1 else param_sync


def take(iterator: Iterable, n: int) -> List:
    """The next n items of an iterator as a list."""
    it = iter(iterator)
    return [next(it) for _ in range(n)]
