"""Triton kernels of the chunked linear cross entropy: the per-element work on one logits tile.

The projection GEMMs stay in cuBLAS (``torch.matmul``); these kernels replace the element-wise
passes over a ``[rows, cols]`` logits tile (a chunk of tokens x a chunk of this rank's vocabulary)
with one pass each, reading the tile in its storage dtype and computing in fp32:

* ``ce_tile_stats_kernel`` (forward): folds the tile into each row's running max ``m``, sum
  ``s = sum exp(logit - m)`` and, where the row's target column lies in the tile, the target logit;
* ``ce_tile_grad_kernel`` (backward): overwrites the tile with ``exp(logit - lse) - [col == target]``
  (the cross entropy's gradient w.r.t. the logits before the per-token scale) in the tile's dtype.

One program per row, looping over the tile's columns in ``BLOCK_V`` steps. Plain pointer
arithmetic, masks and reductions; no ``tl.dot`` (so no interpreter dtype quirks).
"""
import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def ce_tile_stats_kernel(LOGITS, TARGET, M, S, TGT, n_cols, stride_row, stride_col, BLOCK_V: tl.constexpr):
    """Row ``r``: fold logits[r, :n_cols] into (M[r], S[r]); TGT[r] = logits[r, TARGET[r]] when
    0 <= TARGET[r] < n_cols (TARGET is the target's column inside this tile, out of range otherwise)."""
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    m = float("-inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK_V):
        c = start + cols
        x = tl.load(base + c * stride_col, mask=c < n_cols, other=NEG_INF).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
    m_old = tl.load(M + row)
    s_old = tl.load(S + row)
    m_all = tl.maximum(m_old, m)
    s_all = s_old * tl.exp(m_old - m_all) + s * tl.exp(m - m_all)
    tl.store(M + row, m_all)
    tl.store(S + row, s_all)
    target = tl.load(TARGET + row)
    in_tile = (target >= 0) & (target < n_cols)
    safe = tl.where(in_tile, target, 0).to(tl.int64)
    t = tl.load(base + safe * stride_col).to(tl.float32)
    tl.store(TGT + row, t, mask=in_tile)


@triton.jit
def ce_tile_grad_kernel(LOGITS, TARGET, LSE, n_cols, stride_row, stride_col, BLOCK_V: tl.constexpr):
    """Row ``r``: logits[r, c] <- exp(logits[r, c] - LSE[r]) - (c == TARGET[r]), stored in the tile's dtype."""
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    lse = tl.load(LSE + row)
    target = tl.load(TARGET + row)
    for start in range(0, n_cols, BLOCK_V):
        c = start + cols
        valid = c < n_cols
        x = tl.load(base + c * stride_col, mask=valid, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        p = tl.where(c == target, p - 1.0, p)
        tl.store(base + c * stride_col, p.to(LOGITS.dtype.element_ty), mask=valid)
