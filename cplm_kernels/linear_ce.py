"""Linear cross entropy without a logits tensor: ``CE_t = lse_t(h_t W^T) - (h_t W^T)[y_t]``.

The projection onto the (vocab-parallel) output weight and the cross entropy run together over
tiles of ``tokens x vocab`` (:class:`CEChunks`): the forward keeps per token only the running max,
the sum of exponentials and the target logit; the backward recomputes each tile's logits, turns
them into ``softmax - onehot`` in place and accumulates the gradients of the hidden states and the
weight. No more than one tile of logits exists at a time (Megatron's path holds ``[tokens, V/tp]``
fp32 logits and their gradient).

Semantics are those of Megatron-Core's ``vocab_parallel_cross_entropy`` applied to the output of
its ``ColumnParallelLinear`` output layer, including its vocab-parallel reduction: all-reduce the
max (MAX), the rescaled sums of exponentials (SUM) and ``target logit - max`` (SUM, 0 on ranks that
do not own the target), ``CE = log(sum) - (target - max)``; a target outside the vocabulary gives
``log(sum)`` as in Megatron. With ``sequence_parallel`` the hidden rows arrive sharded across the
group and are all-gathered (forward and again in backward, like Megatron's output layer); their
gradient is reduce-scattered, otherwise all-reduced over the group (Megatron's ``allreduce_dgrad``).

``impl``: ``chunked`` does the per-element work of a tile with torch ops; ``fused`` with one Triton
pass per tile (:mod:`cplm_kernels.triton_ce`; GPU, or the interpreter). GEMMs are ``torch.matmul``
in the input dtype (cuBLAS on GPUs), gradients accumulate in fp32.

Importable without megatron-core and without triton; only ``torch.distributed`` for vocab parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

LINEAR_CE_IMPLS = ("chunked", "fused")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # fp64: exact references


@dataclass(frozen=True)
class CEChunks:
    """Tile shape: ``tokens`` rows x ``vocab`` columns of this rank's vocabulary slice, stored
    token-major, or ``vocab_major`` (the GEMM writes ``W_v @ H_t^T``; the tile ops see its transpose)."""

    tokens: int
    vocab: int
    vocab_major: bool = False

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.vocab < 1:
            raise ValueError(f"CEChunks sizes must be >= 1, got tokens={self.tokens}, vocab={self.vocab}")

    @property
    def elements(self) -> int:
        return self.tokens * self.vocab


# GPUs: 4096 x 4096 tiles (32 MiB in bf16) keep the GEMMs at full speed; a narrow vocabulary slice keeps
# the fp32 accumulator of the slice's weight gradient (4 B x slice x h) small in 16-bit training;
# token-major, so that the row kernels read contiguous rows.
GPU_CHUNKS = CEChunks(tokens=4096, vocab=4096)
# CPUs: 8 MiB of fp32, so that a tile stays in cache between its GEMM and its element-wise passes;
# vocab-major, which made the four GEMMs ~6% faster than token-major on a 2-core x86 CPU (MKL) in
# interleaved runs (benchmarks/lm_head_loss.py times both).
CPU_CHUNKS = CEChunks(tokens=1024, vocab=2048, vocab_major=True)


def default_chunks(device: torch.device) -> CEChunks:
    """Tile shape per device kind (GPU_CHUNKS, CPU_CHUNKS)."""
    return GPU_CHUNKS if device.type == "cuda" else CPU_CHUNKS


# ---------------------------------------------------------------- per-tile element-wise work


def torch_tile_stats(tile: torch.Tensor, target_col: torch.Tensor, m: torch.Tensor, s: torch.Tensor,
                     tgt: torch.Tensor) -> None:
    """Fold a logits tile [n, v] into the running fp32 max ``m``, sum ``s = sum exp(logit - m)`` and
    target logit ``tgt`` ([n] each, in place); ``target_col`` is the target's column in the tile
    (rows whose target lies outside ``[0, v)`` keep ``tgt``). Overwrites ``tile`` when it is fp32."""
    n, v = tile.shape
    x = tile.to(m.dtype)  # a copy for 16-bit tiles, the tile itself for fp32
    in_tile = (target_col >= 0) & (target_col < v)
    picked = x.gather(1, target_col.clamp(0, v - 1)[:, None]).squeeze(1)
    tgt.copy_(torch.where(in_tile, picked, tgt))
    m_new = torch.maximum(m, x.amax(dim=1))
    s.mul_(torch.exp(m - m_new)).add_(x.sub_(m_new[:, None]).exp_().sum(dim=1))
    m.copy_(m_new)


def torch_tile_grad(tile: torch.Tensor, target_col: torch.Tensor, lse: torch.Tensor) -> None:
    """Overwrite a logits tile [n, v] with ``exp(logit - lse) - onehot(target_col)`` (its dtype)."""
    n, v = tile.shape
    x = tile.to(lse.dtype)
    x.sub_(lse[:, None]).exp_()
    rows = ((target_col >= 0) & (target_col < v)).nonzero().squeeze(1)
    x[rows, target_col[rows]] -= 1.0
    if x is not tile:
        tile.copy_(x)


def triton_tile_stats(tile, target_col, m, s, tgt) -> None:
    """:func:`torch_tile_stats` in one Triton pass (does not modify the tile)."""
    stats_call(tile, target_col, m, s, tgt, _check_placement(tile)).launch(tile.device)


def triton_tile_grad(tile, target_col, lse) -> None:
    """:func:`torch_tile_grad` in one Triton pass."""
    grad_call(tile, target_col, lse, _check_placement(tile)).launch(tile.device)


def stats_call(tile, target_col, m, s, tgt, interpreted: bool):
    """The forward tile kernel's launch (a :class:`cplm_kernels.fused.KernelCall`, also AOT-compiled)."""
    from cplm_kernels import triton_ce

    return _tile_call(triton_ce.ce_tile_stats_kernel, tile, (tile, target_col, m, s, tgt), interpreted)


def grad_call(tile, target_col, lse, interpreted: bool):
    """The backward tile kernel's launch."""
    from cplm_kernels import triton_ce

    return _tile_call(triton_ce.ce_tile_grad_kernel, tile, (tile, target_col, lse), interpreted)


def _tile_call(kernel, tile: torch.Tensor, pointers: tuple, interpreted: bool):
    """One program per row; up to 4096 columns per step on a GPU (16 fp32 per thread at 8 warps)."""
    from cplm_kernels.fused import KernelCall

    n, v = tile.shape
    block = min(1 << max(v - 1, 1).bit_length(), 1024 if interpreted else 4096)
    return KernelCall(kernel, (n,), (*pointers, v, tile.stride(0), tile.stride(1)), {"BLOCK_V": block},
                      num_warps=1 if interpreted else 8, num_stages=1 if interpreted else 3)


def _check_placement(tile: torch.Tensor) -> bool:
    """Whether the kernels run interpreted; refuses tensors on the other kind of device."""
    from cplm_kernels import triton_ce
    from cplm_kernels.interpreter import check_kernel_placement

    return check_kernel_placement(triton_ce.ce_tile_stats_kernel, tile, "fused cross-entropy")


_TILE_OPS = {"chunked": (torch_tile_stats, torch_tile_grad), "fused": (triton_tile_stats, triton_tile_grad)}


# ---------------------------------------------------------------- vocab/sequence-parallel plumbing


@dataclass(frozen=True)
class _Spec:
    impl: str
    chunks: CEChunks
    vocab_start: int
    group: object  # torch.distributed ProcessGroup, or None: one rank holds the whole vocabulary
    sequence_parallel: bool

    @property
    def world(self) -> int:
        return 1 if self.group is None else dist.get_world_size(self.group)


def _gather_rows(x: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """Sequence parallelism: the full [N, h] rows from every rank's [N / world, h] shard."""
    if not spec.sequence_parallel or spec.world == 1:
        return x
    out = torch.empty((x.shape[0] * spec.world, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=spec.group)
    return out


def _reduce_input_grad(grad: torch.Tensor, spec: _Spec) -> torch.Tensor:
    """Sum the partial hidden-state gradients of the vocabulary slices (reduce-scatter under SP)."""
    if spec.world == 1:
        return grad
    if spec.sequence_parallel:
        out = torch.empty((grad.shape[0] // spec.world, *grad.shape[1:]), dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=spec.group)
        return out
    dist.all_reduce(grad, group=spec.group)
    return grad


def _spans(total: int, step: int):
    return [(a, min(total, a + step)) for a in range(0, total, step)]


def _tile_buffer(n_tok: int, n_voc: int, chunks: CEChunks, like: torch.Tensor) -> torch.Tensor:
    """Storage for the largest tile: ``min(tokens, N) x min(vocab, V)`` elements of ``like``'s dtype."""
    size = min(chunks.tokens, n_tok) * min(chunks.vocab, n_voc)
    return torch.empty(size, dtype=like.dtype, device=like.device)


def _logits_tile(buf: torch.Tensor, rows: torch.Tensor, w_v: torch.Tensor, vocab_major: bool) -> torch.Tensor:
    """``rows @ w_v.T`` ([n, v]) computed into ``buf``: a contiguous tile, or the transposed view of a
    vocab-major one."""
    n, v = rows.shape[0], w_v.shape[0]
    if vocab_major:
        out = buf[: n * v].view(v, n)
        torch.matmul(w_v, rows.t(), out=out)
        return out.t()
    out = buf[: n * v].view(n, v)
    torch.matmul(rows, w_v.t(), out=out)
    return out


# ---------------------------------------------------------------- forward / backward


def _forward(full: torch.Tensor, weight: torch.Tensor, local_target: torch.Tensor, spec: _Spec):
    """This rank's (max, sum exp(logit - max), target logit) per token, fp32 [N] each."""
    n_tok, n_voc = full.shape[0], weight.shape[0]
    stats_op, _ = _TILE_OPS[spec.impl]
    m = torch.full((n_tok,), float("-inf"), dtype=_acc_dtype(full), device=full.device)
    s = torch.zeros_like(m)
    tgt = torch.zeros_like(m)
    buf = _tile_buffer(n_tok, n_voc, spec.chunks, full)
    for v0, v1 in _spans(n_voc, spec.chunks.vocab):
        for t0, t1 in _spans(n_tok, spec.chunks.tokens):
            tile = _logits_tile(buf, full[t0:t1], weight[v0:v1], spec.chunks.vocab_major)
            stats_op(tile, local_target[t0:t1] - v0, m[t0:t1], s[t0:t1], tgt[t0:t1])
    return m, s, tgt


def _combine(m, s, tgt, owner, spec: _Spec):
    """Megatron's vocab-parallel reduction -> (per-token CE, log-sum-exp over the full vocabulary)."""
    if spec.world > 1:
        local_max = m.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=spec.group)  # m is now the global max
        s.mul_(torch.exp(local_max - m))
    predicted = torch.where(owner, tgt - m, 0.0)
    if spec.world > 1:
        dist.all_reduce(s, group=spec.group)
        dist.all_reduce(predicted, group=spec.group)
    log_sum = torch.log(s)
    return log_sum - predicted, m + log_sum


def _backward(full, weight, local_target, lse, g, spec: _Spec, need_input: bool, need_weight: bool):
    """(d hidden [N, h] before the group reduction, d weight [V, h]) for per-token loss gradients ``g``."""
    n_tok, n_voc = full.shape[0], weight.shape[0]
    _, grad_op = _TILE_OPS[spec.impl]
    acc = _acc_dtype(full)
    exact = full.dtype == acc  # accumulate into the outputs; else in fp32 buffers
    d_in = torch.zeros(full.shape, dtype=acc, device=full.device) if need_input else None
    d_w = torch.empty_like(weight) if need_weight else None
    buf = _tile_buffer(n_tok, n_voc, spec.chunks, full)
    scaled_rows = torch.empty((min(spec.chunks.tokens, n_tok), full.shape[1]), dtype=full.dtype, device=full.device)
    for v0, v1 in _spans(n_voc, spec.chunks.vocab):
        w_v = weight[v0:v1]
        if need_weight:
            d_w_v = d_w[v0:v1] if exact else torch.empty(w_v.shape, dtype=acc, device=w_v.device)
            d_w_v.zero_()
        for t0, t1 in _spans(n_tok, spec.chunks.tokens):
            tile = _logits_tile(buf, full[t0:t1], w_v, spec.chunks.vocab_major)
            grad_op(tile, local_target[t0:t1] - v0, lse[t0:t1])  # softmax - onehot; g is applied to rows
            if need_input:
                _accumulate(d_in[t0:t1], tile, w_v)
            if need_weight:
                rows = torch.mul(full[t0:t1], g[t0:t1, None].to(full.dtype), out=scaled_rows[: t1 - t0])
                _accumulate(d_w_v, tile.t(), rows)
        if need_weight and not exact:
            d_w[v0:v1].copy_(d_w_v)
    if need_input:
        d_in = d_in.mul_(g[:, None]).to(full.dtype)
    return d_in, d_w


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Statistics and gradient accumulation: fp32 (fp64 stays fp64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b; in place when a, b have acc's dtype, else through a product in their dtype."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(a @ b)


class _LinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, spec: _Spec):
        full = _gather_rows(hidden, spec)
        local_target = targets.reshape(-1).to(torch.int64) - spec.vocab_start
        m, s, tgt = _forward(full, weight, local_target, spec)
        owner = (local_target >= 0) & (local_target < weight.shape[0])
        loss, lse = _combine(m, s, tgt, owner, spec)
        ctx.save_for_backward(hidden, weight, local_target, lse)
        ctx.spec = spec
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, local_target, lse = ctx.saved_tensors
        spec = ctx.spec
        need_input, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        full = _gather_rows(hidden, spec)
        d_in, d_w = _backward(full, weight, local_target, lse, grad_loss.to(lse.dtype).contiguous(), spec,
                              need_input, need_weight)
        if need_input:
            d_in = _reduce_input_grad(d_in, spec)
        return d_in, d_w, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    impl: str = "chunked",
    vocab_start: int = 0,
    group=None,
    sequence_parallel: bool = False,
    chunks: CEChunks | None = None,
) -> torch.Tensor:
    """Per-token ``CE [N]`` (fp32; fp64 for fp64 inputs) of ``logits = hidden @ weight.T`` without materializing the logits.

    hidden: ``[N, h]`` rows (``[N / world, h]`` this rank's shard with ``sequence_parallel``);
    weight: ``[V_local, h]``, this rank's vocabulary rows ``[vocab_start, vocab_start + V_local)``;
    targets: ``[N]`` integer token ids (all N rows). ``group``: the vocab-parallel process group
    (``None``: no vocab parallelism). Gradients flow to ``hidden`` and ``weight`` in their dtype.
    """
    if impl not in LINEAR_CE_IMPLS:
        raise ValueError(f"impl={impl!r}; expected one of {LINEAR_CE_IMPLS}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden must be [N, h] and weight [V, h]; got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    if hidden.dtype != weight.dtype or hidden.dtype not in _DTYPES:
        raise ValueError(f"hidden/weight dtypes must match and be one of {_DTYPES}; got {hidden.dtype}, {weight.dtype}")
    if impl == "fused" and hidden.dtype == torch.float64:
        raise ValueError("impl='fused' takes fp32/bf16/fp16 inputs; use impl='chunked' for fp64")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer token ids, got {targets.dtype}")
    spec = _Spec(impl, chunks or default_chunks(hidden.device), int(vocab_start), group, sequence_parallel)
    rows = hidden.shape[0] * (spec.world if sequence_parallel else 1)
    if targets.numel() != rows:
        raise ValueError(f"targets has {targets.numel()} entries, expected one per (gathered) hidden row: {rows}")
    return _LinearCE.apply(hidden, weight, targets, spec)


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Single-rank ground truth with materialized logits (``[N, V]``) in the inputs' dtype, the cross
    entropy in fp32 (fp64 stays fp64). Megatron's out-of-range rule, gradient included:
    ``CE = log(sum exp(logit - max))`` with the max a constant."""
    logits = hidden @ weight.t()
    logits = logits if logits.dtype == torch.float64 else logits.float()
    top = logits.amax(dim=1, keepdim=True).detach()
    log_sum = torch.log(torch.exp(logits - top).sum(dim=1))
    t = targets.reshape(-1).to(torch.int64)
    in_vocab = (t >= 0) & (t < weight.shape[0])
    picked = logits.gather(1, t.clamp(0, weight.shape[0] - 1)[:, None]).squeeze(1) - top.squeeze(1)
    return log_sum - torch.where(in_vocab, picked, torch.zeros_like(picked))
