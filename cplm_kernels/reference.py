"""Pure-PyTorch Copy-Paste scores: the ground truth (`naive`) and the CPU path (`chunked`).

Both compute, for every (sequence b, copy head c, query t), two log-sum-exps of the scaled scores
``s_tj = <q_t, k_j> * scale`` over the candidates ``j`` of ``t`` (see docs/design.md):

* ``lse_all[b, c, t]   = logsumexp_{j in C(t)} s_tj``
* ``lse_match[b, c, t] = logsumexp_{j in C(t), y_j == y_t} s_tj``

with ``C(t) = {j < t : doc_j == doc_t and y_j >= 0}``; an empty set gives ``-inf``.
``log p_copy(y_t)`` for head c is ``lse_match - lse_all``. Labels ``< 0`` mark ignored/padded
positions: they are never candidates and never match.

Shapes: ``q, k: [b, H, T, d]`` (any float dtype; math in fp32), ``labels: [b, T]`` int,
``doc_ids: [b, T]`` int or ``None`` (one document per row). Outputs are ``[b, H, T]`` in fp32 (fp64 for fp64 inputs).
"""
from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")


def default_scale(head_dim: int) -> float:
    """The softmax temperature of docs/design.md: 1/sqrt(d_c)."""
    return 1.0 / math.sqrt(head_dim)


def candidate_masks(
    labels: torch.Tensor,
    doc_ids: torch.Tensor | None,
    q_start: int = 0,
    q_end: int | None = None,
    k_end: int | None = None,
    q_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``[b, tq, tk]`` masks (candidate, matching candidate) for queries [q_start, q_end)
    against keys [0, k_end). With ``q_positions`` ``[Tq]`` (context parallelism) query i sits at global
    position ``q_positions[i]`` and ``labels``/``doc_ids`` are the global ``[b, T]`` ones."""
    if q_positions is None:
        T = labels.shape[1]
        q_end = T if q_end is None else q_end
        tq = torch.arange(q_start, q_end, device=labels.device)
        k_end = q_end if k_end is None else k_end
    else:
        q_end = q_positions.shape[0] if q_end is None else q_end
        tq = q_positions[q_start:q_end]
        k_end = int(tq.max()) + 1 if k_end is None else k_end
    tk = torch.arange(0, k_end, device=labels.device)
    cand = (tk[None, :] < tq[:, None])[None] & (labels[:, None, :k_end] >= 0)
    if doc_ids is not None:
        cand = cand & (doc_ids[:, tq, None] == doc_ids[:, None, :k_end])
    match = cand & (labels[:, tq, None] == labels[:, None, :k_end])
    return cand, match


def _acc(x: torch.Tensor) -> torch.Tensor:
    """Accumulation dtype: fp32, or fp64 when the input is fp64 (for gradient checks)."""
    return x if x.dtype == torch.float64 else x.float()


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.einsum("bhtd,bhjd->bhtj", _acc(q), _acc(k)) * scale


def _masked_lse(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(scores.masked_fill(~mask, NEG_INF), dim=-1)


def copy_lse_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    labels: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    q_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: materializes the ``[b, H, Tq, T]`` scores. Differentiable by autograd. ``q_positions``:
    the global positions of the queries (context parallelism; k, labels, doc_ids global), default 0 .. T-1."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    scores = _scores(q, k, scale)
    cand, match = candidate_masks(labels, doc_ids, k_end=k.shape[2], q_positions=q_positions)
    return _masked_lse(scores, cand[:, None]), _masked_lse(scores, match[:, None])


def _key_end(q_positions, t0: int, t1: int) -> int:
    """Keys a query block [t0, t1) can see: [0, t1), or up to its last global position under CP."""
    return t1 if q_positions is None else int(q_positions[t0:t1].max()) + 1


def _block_probs(q, k, labels, doc_ids, scale, t0, t1, lse_all, lse_match, q_positions=None):
    """Recompute (scores, P_all, P_match) for queries [t0, t1) against the keys they can see."""
    ke = _key_end(q_positions, t0, t1)
    s = _scores(q[:, :, t0:t1], k[:, :, :ke], scale)
    cand, match = candidate_masks(labels, doc_ids, t0, t1, k_end=ke, q_positions=q_positions)
    la = lse_all[:, :, t0:t1, None]
    lm = lse_match[:, :, t0:t1, None]
    # where a row is empty its lse is -inf: use 0 there so exp() stays finite (masked anyway)
    p_all = torch.where(cand[:, None], torch.exp(s - torch.where(torch.isinf(la), 0.0, la)), 0.0)
    p_match = torch.where(match[:, None], torch.exp(s - torch.where(torch.isinf(lm), 0.0, lm)), 0.0)
    return s, p_all, p_match


class _ChunkedCopyLSE(torch.autograd.Function):
    """Query-blocked forward and recomputing backward: memory O(T * block) per head."""

    @staticmethod
    def forward(ctx, q, k, labels, doc_ids, scale, block, q_positions=None):
        b, H, T, _ = q.shape
        lse_all = torch.full((b, H, T), NEG_INF, dtype=_acc(q).dtype, device=q.device)
        lse_match = torch.full_like(lse_all, NEG_INF)
        for t0 in range(0, T, block):
            t1 = min(T, t0 + block)
            ke = _key_end(q_positions, t0, t1)
            s = _scores(q[:, :, t0:t1], k[:, :, :ke], scale)
            cand, match = candidate_masks(labels, doc_ids, t0, t1, k_end=ke, q_positions=q_positions)
            lse_all[:, :, t0:t1] = _masked_lse(s, cand[:, None])
            lse_match[:, :, t0:t1] = _masked_lse(s, match[:, None])
        ctx.save_for_backward(q, k, labels, doc_ids, lse_all, lse_match, q_positions)
        ctx.scale, ctx.block = scale, block
        return lse_all, lse_match

    @staticmethod
    def backward(ctx, g_all, g_match):
        q, k, labels, doc_ids, lse_all, lse_match, q_positions = ctx.saved_tensors
        scale, block = ctx.scale, ctx.block
        T = q.shape[2]
        g_all = torch.zeros_like(lse_all) if g_all is None else g_all
        g_match = torch.zeros_like(lse_match) if g_match is None else g_match
        # gradients of empty rows are meaningless (the output is a constant -inf)
        g_all = torch.where(torch.isinf(lse_all), 0.0, g_all.to(lse_all.dtype))
        g_match = torch.where(torch.isinf(lse_match), 0.0, g_match.to(lse_all.dtype))
        dq = torch.zeros_like(q, dtype=lse_all.dtype)
        dk = torch.zeros_like(k, dtype=lse_all.dtype)
        for t0 in range(0, T, block):
            t1 = min(T, t0 + block)
            ke = _key_end(q_positions, t0, t1)
            _, p_all, p_match = _block_probs(q, k, labels, doc_ids, scale, t0, t1, lse_all, lse_match,
                                             q_positions)
            ds = (g_all[:, :, t0:t1, None] * p_all + g_match[:, :, t0:t1, None] * p_match) * scale
            dq[:, :, t0:t1] = torch.einsum("bhtj,bhjd->bhtd", ds, _acc(k[:, :, :ke]))
            dk[:, :, :ke] += torch.einsum("bhtj,bhtd->bhjd", ds, _acc(q[:, :, t0:t1]))
        return dq.to(q.dtype), dk.to(k.dtype), None, None, None, None, None


def copy_lse_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    labels: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    block: int = 128,
    q_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same values and gradients as :func:`copy_lse_naive` without the ``[T, T]`` tensors (``q_positions``
    as there). Under context parallelism a query block should not straddle the two CP chunks of a rank
    (it still is exact; it only sees more keys than it needs)."""
    scale = default_scale(q.shape[-1]) if scale is None else scale
    return _ChunkedCopyLSE.apply(q, k, labels, doc_ids, scale, block, q_positions)


def copy_distribution(
    q: torch.Tensor,
    k: torch.Tensor,
    labels: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    block: int = 128,
    return_lse: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Copy distribution restricted to the vocab slice [vocab_start, vocab_end).

    Returns ``(p_copy [b, T, vocab_end - vocab_start] fp32, has_candidate [b, T] bool)``; ``p_copy``
    is the head-averaged attention mass scattered onto candidate labels inside the slice (rows with
    no candidate are zero). With ``return_lse`` also ``lse_all [b, H, T]`` (the candidates' log-sum-exp
    per head, as :func:`copy_lse_naive`; the copy statistics a mixing rule may read). Query-blocked,
    memory O(T * block + T * V_slice).
    """
    scale = default_scale(q.shape[-1]) if scale is None else scale
    b, _, T, _ = q.shape
    V = vocab_end - vocab_start
    out = torch.zeros(b, T, V, dtype=_acc(q).dtype, device=q.device)
    has_cand = torch.zeros(b, T, dtype=torch.bool, device=q.device)
    lse_all = torch.full((b, q.shape[1], T), NEG_INF, dtype=out.dtype, device=q.device) if return_lse else None
    in_slice = (labels >= vocab_start) & (labels < vocab_end)
    local = torch.where(in_slice, labels - vocab_start, 0)
    for t0 in range(0, T, block):
        t1 = min(T, t0 + block)
        s = _scores(q[:, :, t0:t1], k[:, :, :t1], scale)
        cand, _ = candidate_masks(labels, doc_ids, t0, t1)
        masked = s.masked_fill(~cand[:, None], NEG_INF)
        if lse_all is not None:
            lse_all[:, :, t0:t1] = torch.logsumexp(masked, dim=-1)
        a = torch.softmax(masked, dim=-1)
        a = torch.nan_to_num(a, nan=0.0).mean(dim=1)  # empty rows: softmax of all -inf is NaN
        a = a * in_slice[:, None, :t1]
        idx = local[:, None, :t1].expand(-1, t1 - t0, -1)
        out[:, t0:t1].scatter_add_(-1, idx, a)
        has_cand[:, t0:t1] = cand.any(-1)
    return (out, has_cand, lse_all) if return_lse else (out, has_cand)
