"""Context parallelism (CP) without Transformer Engine: Megatron's load-balanced sequence split and the
all-gather of a sequence-sharded tensor whose backward returns each rank's gradient to its owner.

Layout (Megatron's `get_batch_on_this_cp_rank`): a sequence of length S is cut into 2N chunks; CP rank i
holds chunks i and 2N-1-i (so every rank has the same causal work). `local_positions` are the GLOBAL
positions of the rank's tokens in that order; `gather_sequence` concatenates every rank's tokens and
puts them back in global order (positions 0 .. S-1).
"""
from __future__ import annotations

import functools
import sys
from typing import Dict, Optional

import torch
import torch.distributed as dist


def cp_group() -> Optional[dist.ProcessGroup]:
    """Megatron's context-parallel group, or None before parallel state exists (CP = 1)."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None:  # megatron not even imported: no parallel state (and no 20 s import to find that out)
        return None

    if not ps.model_parallel_is_initialized():
        return None
    return ps.get_context_parallel_group(check_initialized=False)


def cp_size_rank(group: Optional[dist.ProcessGroup] = None) -> tuple[int, int]:
    """(size, rank) of the CP group; (1, 0) without one."""
    group = cp_group() if group is None else group
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def local_positions(seq_len: int, size: int, rank: int, device: torch.device | None = None) -> torch.Tensor:
    """Global positions held by CP rank `rank` of `size`: chunks rank and 2*size-1-rank of 2*size."""
    chunk = seq_len // (2 * size)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk, device=device)
    return torch.cat([first, second])


def split_batch(batch: Dict[str, Optional[torch.Tensor]]) -> Dict[str, Optional[torch.Tensor]]:
    """This CP rank's part of a batch (Megatron's own `get_batch_on_this_cp_rank`: dim 1, or the query
    rows (dim 2) of `attention_mask` [b, 1, s, s], whose key columns stay global)."""
    size, _ = cp_size_rank()
    if size == 1:
        return batch
    from megatron.core.utils import get_batch_on_this_cp_rank

    return get_batch_on_this_cp_rank(dict(batch), cp_group=cp_group())


@functools.lru_cache(maxsize=32)
def _orders(seq_len: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(gathered -> global, global -> gathered) index vectors for a gathered sequence of `seq_len` (a pure
    function of its arguments, memoised: every layer of every step asks for the same one)."""
    gathered_pos = torch.cat([local_positions(seq_len, size, r, device) for r in range(size)])
    return torch.argsort(gathered_pos), gathered_pos


def _all_gather(x: torch.Tensor, dim: int, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


class _GatherSequence(torch.autograd.Function):
    """All-gather along `dim` into global order; backward: sum every rank's gradient of the gathered
    tensor and keep this rank's positions (a reduce-scatter; all-reduce + slice on gloo, which has none)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
        size, rank = cp_size_rank(group)
        ctx.dim, ctx.group, ctx.size, ctx.rank, ctx.local = dim, group, size, rank, x.shape[dim]
        gathered = _all_gather(x, dim, group, size)
        to_global, _ = _orders(gathered.shape[dim], size, x.device)
        return gathered.index_select(dim, to_global)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dim, group, size, rank, local = ctx.dim, ctx.group, ctx.size, ctx.rank, ctx.local
        _, to_gathered = _orders(grad.shape[dim], size, grad.device)
        grad = grad.index_select(dim, to_gathered).contiguous()  # rank r's positions at [r*local, (r+1)*local)
        if dist.get_backend(group) == "gloo":
            dist.all_reduce(grad, group=group)
            return grad.narrow(dim, rank * local, local).contiguous(), None, None
        moved = grad.movedim(dim, 0).contiguous()
        out = torch.empty((local,) + moved.shape[1:], dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, moved, group=group)
        return out.movedim(0, dim).contiguous(), None, None


def gather_sequence(x: torch.Tensor, dim: int) -> torch.Tensor:
    """This CP rank's tokens along `dim` -> every rank's, in global order (identity at CP = 1).
    Differentiable: the gradient of each position goes back to the rank that holds it, summed over ranks."""
    group = cp_group()
    if group is None or dist.get_world_size(group) == 1:
        return x
    if x.requires_grad or x.dtype.is_floating_point:
        return _GatherSequence.apply(x, dim, group)
    size, _ = cp_size_rank(group)
    gathered = _all_gather(x, dim, group, size)
    to_global, _ = _orders(gathered.shape[dim], size, x.device)
    return gathered.index_select(dim, to_global)


def max_over_cp(x: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of `x` over the CP ranks (not differentiable; `x` itself at CP = 1)."""
    group = cp_group()
    if group is None or dist.get_world_size(group) == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


def this_rank_positions(local_len: int, device: torch.device) -> Optional[torch.Tensor]:
    """Global positions of this CP rank's `local_len` tokens, or None at CP = 1."""
    size, rank = cp_size_rank()
    if size == 1:
        return None
    return local_positions(local_len * size, size, rank, device)
