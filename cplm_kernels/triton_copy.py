"""Triton kernels of the fused Copy-Paste scores: forward LSEs, dQ and dK (FlashAttention-2 style).

For each (sequence b, head h) and query t, over the candidates C(t) = {j < t : doc_j == doc_t,
y_j >= 0} and the matching subset M(t) = {j in C(t) : y_j == y_t}:

    lse_all[t]   = logsumexp_{j in C(t)} s_tj          s_tj = <q_t, k_j> * scale
    lse_match[t] = logsumexp_{j in M(t)} s_tj

Forward streams key tiles with two online log-sum-exps (log2 domain) and stores only the two
floats per row. Backward recomputes the scores from those statistics:
dS_tj = g_all_t * P_all_tj + g_match_t * P_match_tj, dQ = scale * dS K, dK = scale * dS^T Q.
dQ (one program per query tile) and dK (one program per key tile) are separate kernels: each output
tile is written exactly once. The alternative, one key-tile kernel adding dQ with atomics, issues
d/BLOCK_N fp32 atomic adds per score into a shared dQ (T=32k, d=128: ~1e9 per head, all contending
for the same rows), needs a zeroed fp32 buffer and is nondeterministic; recomputation costs one
more Q K^T on tensor cores plus the per-score elementwise work in the dQ kernel. (Not yet timed
against each other on an H200.)

Elementwise work, not matmuls, dominates (one Q K^T per score and no P V, but masks and two
log-sum-exps): when a tile's matching scores are within 2^64 of its best candidate score,
P_match = P_all * 2^(lse_all - lse_match) reuses the candidate exponentials (one exp2 per score
instead of two); tiles with larger gaps take the exact two-exp2 path, so nothing underflows that
the reference keeps.

Context parallelism: queries may be a subset of the sequence. ``QPOS`` (int32 ``[TQ]``, strictly increasing)
gives each query row's global position; keys, labels and document ids cover the whole sequence (``TK`` rows).
Without CP ``QPOS`` is ``0 .. T-1`` and ``TQ == TK``. Causal masks, labels and documents use global positions;
q rows, LSEs, incoming gradients and dQ use local rows.

Operand conversions for tl.dot come from :mod:`cplm_kernels.interpreter` as constexpr codes
(0 native, 1 fp32, 2 bf16). FP8 inputs carry per-row scales applied to the fp32 accumulator.
Only plain pointer arithmetic, masks, tl.dot and reductions: stable Triton language features.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_INF = tl.constexpr(float("-inf"))
# log2 units: with gap <= 64, matching terms within 2^-62 of their own maximum are >= 2^-126 in
# exp2(s - lse_all), i.e. normal fp32 (GPUs flush denormals), so sharing the exponential loses nothing.
SHARED_EXP_MAX_GAP = tl.constexpr(64.0)


@triton.jit
def _dot_operand(x, MODE: tl.constexpr):
    """Convert a tile before tl.dot: 0 as loaded, 1 to fp32, 2 to bf16."""
    if MODE == 1:
        x = x.to(tl.float32)
    elif MODE == 2:
        x = x.to(tl.bfloat16)
    return x


@triton.jit
def _load_tile(ptr, rows, valid, stride_row, stride_d, HEAD_DIM: tl.constexpr):
    """Rows ``rows`` of a [T, d] matrix; rows past T read as zeros (scores 0, never NaN)."""
    offs_d = tl.arange(0, HEAD_DIM)
    return tl.load(ptr + rows[:, None] * stride_row + offs_d[None, :] * stride_d, mask=valid[:, None], other=0.0)


@triton.jit
def _load_row_scales(ptr, rows, valid, rows_per_scale, stride_block):
    """FP8 dequantization scale of each row (per-tensor scales arrive with stride 0)."""
    return tl.load(ptr + (rows // rows_per_scale) * stride_block, mask=valid, other=1.0)


@triton.jit
def _column_or_row(v, AS_COLUMN: tl.constexpr):
    """A per-row vector broadcast along the score tile's rows ([n, 1]) or columns ([1, n])."""
    if AS_COLUMN:
        out = v[:, None]
    else:
        out = v[None, :]
    return out


@triton.jit
def _load_rows(X, LAB, DOC, SCALE, rows, pos, valid, stride_t, stride_d, stride_lab_t, stride_doc_t, scale_rows,
               stride_scale_blk, HEAD_DIM: tl.constexpr, HAS_DOC: tl.constexpr, IS_FP8: tl.constexpr,
               AS_COLUMN: tl.constexpr):
    """Rows ``rows`` of q or k (at global positions ``pos``) with what the masks and scores need of them: labels
    and document ids shaped for the score tile (document id 0 without documents) and FP8 row scales (1.0
    without FP8)."""
    x = _load_tile(X, rows, valid, stride_t, stride_d, HEAD_DIM)
    lab = _column_or_row(tl.load(LAB + pos * stride_lab_t, mask=valid, other=-1), AS_COLUMN)
    doc = 0
    if HAS_DOC:
        doc = _column_or_row(tl.load(DOC + pos * stride_doc_t, mask=valid, other=-1), AS_COLUMN)
    scale = 1.0
    if IS_FP8:
        scale = _load_row_scales(SCALE, rows, valid, scale_rows, stride_scale_blk)
    return x, lab, doc, scale


@triton.jit
def _scores_log2(a, b_t, a_scale, b_scale, qk_scale_log2, IS_FP8: tl.constexpr, MODE: tl.constexpr,
                 PRECISION: tl.constexpr):
    """log2-domain scores ``(a @ b_t) * scale * log2(e)``, FP8 row/column scales applied to the accumulator."""
    acc = tl.dot(_dot_operand(a, MODE), _dot_operand(b_t, MODE), input_precision=PRECISION)
    if IS_FP8:
        return acc * (a_scale * qk_scale_log2)[:, None] * b_scale[None, :]
    return acc * qk_scale_log2


@triton.jit
def _pair_masks(t, j, lab_t, lab_j, doc_t, doc_j, HAS_DOC: tl.constexpr):
    """(candidate, matching candidate) masks from broadcast-shaped query/key indices, labels, docs."""
    cand = (j < t) & (lab_j >= 0)
    if HAS_DOC:
        cand = cand & (doc_t == doc_j)
    return cand, cand & (lab_t == lab_j)


@triton.jit
def _online_lse_update(s, cand, match, m_all, l_all, m_match, l_match, SHARED_EXP: tl.constexpr):
    """Fold one [M, N] tile of log2 scores into the running (max, sum) of both sets."""
    s_all = tl.where(cand, s, NEG_INF)
    m_all_new = tl.maximum(m_all, tl.max(s_all, 1))
    base_all = tl.where(m_all_new == NEG_INF, 0.0, m_all_new)
    p_all = tl.exp2(s_all - base_all[:, None])
    l_all = l_all * tl.exp2(m_all - base_all) + tl.sum(p_all, 1)

    s_match = tl.where(match, s, NEG_INF)
    m_match_new = tl.maximum(m_match, tl.max(s_match, 1))
    base_match = tl.where(m_match_new == NEG_INF, 0.0, m_match_new)
    if SHARED_EXP:
        gap = tl.where(m_match_new == NEG_INF, 0.0, base_all - base_match)  # >= 0: M(t) within C(t)
        if tl.max(gap, 0) <= SHARED_EXP_MAX_GAP:
            p_match = tl.where(match, p_all * tl.exp2(gap)[:, None], 0.0)
        else:
            p_match = tl.exp2(s_match - base_match[:, None])
    else:
        p_match = tl.exp2(s_match - base_match[:, None])
    l_match = l_match * tl.exp2(m_match - base_match) + tl.sum(p_match, 1)
    return m_all_new, l_all, m_match_new, l_match


@triton.jit
def _finish_lse(m, total):
    """Natural-log LSE from a log2-domain (max, sum); an empty set gives -inf."""
    return tl.where(total > 0.0, (m + tl.log2(tl.where(total > 0.0, total, 1.0))) * LN2, NEG_INF)


@triton.jit
def _load_row_stats(LSE_ALL, LSE_MATCH, G_ALL, G_MATCH, rows, offs, valid, stride_ga_t, stride_gm_t, grad_scale):
    """Backward row statistics in log2 units, gradients pre-multiplied by ``grad_scale``.

    Empty sets get zero gradient (never NaN). Returns (lse_all, lse_match, g_all, g_match,
    coef_match, gap_ok) where, when ``gap_ok`` (a scalar over the tile),
    ``g_match * P_match == coef_match * P_all`` on matching entries.
    """
    lse_all = tl.load(LSE_ALL + rows, mask=valid, other=NEG_INF)
    lse_match = tl.load(LSE_MATCH + rows, mask=valid, other=NEG_INF)
    g_all = tl.load(G_ALL + offs * stride_ga_t, mask=valid, other=0.0).to(tl.float32) * grad_scale
    g_match = tl.load(G_MATCH + offs * stride_gm_t, mask=valid, other=0.0).to(tl.float32) * grad_scale
    empty_all = lse_all == NEG_INF
    empty_match = lse_match == NEG_INF
    g_all = tl.where(empty_all, 0.0, g_all)
    g_match = tl.where(empty_match, 0.0, g_match)
    la2 = tl.where(empty_all, 0.0, lse_all * LOG2E)
    lm2 = tl.where(empty_match, 0.0, lse_match * LOG2E)
    gap = tl.where(g_match != 0.0, la2 - lm2, 0.0)  # >= 0 up to rounding: M(t) within C(t)
    gap_ok = tl.max(gap, 0) <= SHARED_EXP_MAX_GAP
    coef_match = g_match * tl.exp2(tl.minimum(gap, SHARED_EXP_MAX_GAP))
    return la2, lm2, g_all, g_match, coef_match, gap_ok


@triton.jit
def _score_grads_exact(s, cand, match, la2, lm2, g_all, g_match):
    """dLoss/ds = g_all * P_all + g_match * P_match with one exp2 per set (any gap)."""
    return g_all * tl.exp2(tl.where(cand, s, NEG_INF) - la2) + g_match * tl.exp2(tl.where(match, s, NEG_INF) - lm2)


@triton.jit
def _score_grads(s, cand, match, la2, lm2, g_all, g_match, coef_match, gap_ok, SHARED_EXP: tl.constexpr):
    """dLoss/ds (row statistics broadcast-shaped, log2 units), sharing the exp2 when the gap allows."""
    if SHARED_EXP:
        if gap_ok:
            p_all = tl.exp2(tl.where(cand, s, NEG_INF) - la2)
            ds = p_all * (g_all + tl.where(match, coef_match, 0.0))
        else:
            ds = _score_grads_exact(s, cand, match, la2, lm2, g_all, g_match)
    else:
        ds = _score_grads_exact(s, cand, match, la2, lm2, g_all, g_match)
    return ds


@triton.jit
def _grad_dot(ds, x, acc, MODE: tl.constexpr, PRECISION: tl.constexpr):
    """acc += ds @ x with ds in the operand type of x (mode 0), fp32 (1) or bf16 (2)."""
    if MODE == 0:
        a = ds.to(x.dtype)
        b = x
    else:
        a = _dot_operand(ds, MODE)
        b = _dot_operand(x, MODE)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def copy_lse_fwd_kernel(
    Q, K, LAB, DOC, Q_SCALE, K_SCALE, QPOS, KEY_START, LSE_ALL, LSE_MATCH,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_lab_b, stride_lab_t, stride_doc_b, stride_doc_t,
    stride_qs_b, stride_qs_h, stride_qs_blk, stride_ks_b, stride_ks_h, stride_ks_blk,
    q_scale_rows, k_scale_rows, stride_start_b,
    H, TQ, TK, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
    IS_FP8: tl.constexpr, SCORE_MODE: tl.constexpr, PRECISION: tl.constexpr, SHARED_EXP: tl.constexpr,
):
    """One program per (query tile, b*H): both LSEs of BLOCK_M query rows (outputs contiguous [b, H, TQ])."""
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # long causal rows first: better tail balance
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    start_m = tile * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_valid = offs_m < TQ
    pos_m = tl.load(QPOS + offs_m, mask=m_valid, other=-1)  # global positions (increasing)
    K_bh = K + b * stride_kb + h * stride_kh
    LAB_b = LAB + b * stride_lab_b
    DOC_b = DOC + b * stride_doc_b
    KS_bh = K_SCALE + b * stride_ks_b + h * stride_ks_h

    q, lab_q, doc_q, sq = _load_rows(Q + b * stride_qb + h * stride_qh, LAB_b, DOC_b,
                                     Q_SCALE + b * stride_qs_b + h * stride_qs_h, offs_m, pos_m, m_valid, stride_qt,
                                     stride_qd, stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
                                     HEAD_DIM, HAS_DOC, IS_FP8, True)
    key_start = 0
    if HAS_DOC:
        key_start = tl.load(KEY_START + b * stride_start_b + tile)

    m_all = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_all = tl.zeros([BLOCK_M], tl.float32)
    m_match = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_match = tl.zeros([BLOCK_M], tl.float32)
    key_end = tl.load(QPOS + tl.minimum(start_m + BLOCK_M, TQ) - 1)  # keys j < t <= the tile's last position
    for start_n in range(key_start, key_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < TK
        k, lab_k, doc_k, sk = _load_rows(K_bh, LAB_b, DOC_b, KS_bh, offs_n, offs_n, n_valid, stride_kt, stride_kd,
                                         stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                                         HEAD_DIM, HAS_DOC, IS_FP8, False)
        s = _scores_log2(q, tl.trans(k), sq, sk, qk_scale_log2, IS_FP8, SCORE_MODE, PRECISION)
        cand, match = _pair_masks(pos_m[:, None], offs_n[None, :], lab_q, lab_k, doc_q, doc_k, HAS_DOC)
        m_all, l_all, m_match, l_match = _online_lse_update(s, cand, match, m_all, l_all, m_match, l_match,
                                                            SHARED_EXP)

    out = pid_bh * TQ + offs_m
    tl.store(LSE_ALL + out, _finish_lse(m_all, l_all), mask=m_valid)
    tl.store(LSE_MATCH + out, _finish_lse(m_match, l_match), mask=m_valid)


@triton.jit
def copy_lse_bwd_dq_kernel(
    Q, K, LAB, DOC, Q_SCALE, K_SCALE, QPOS, KEY_START, LSE_ALL, LSE_MATCH, G_ALL, G_MATCH, DQ,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_lab_b, stride_lab_t, stride_doc_b, stride_doc_t,
    stride_qs_b, stride_qs_h, stride_qs_blk, stride_ks_b, stride_ks_h, stride_ks_blk,
    q_scale_rows, k_scale_rows, stride_start_b,
    stride_ga_b, stride_ga_h, stride_ga_t, stride_gm_b, stride_gm_h, stride_gm_t,
    H, TQ, TK, qk_scale_log2, grad_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
    IS_FP8: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr, PRECISION: tl.constexpr,
    SHARED_EXP: tl.constexpr,
):
    """One program per (query tile, b*H): dQ of BLOCK_M rows (DQ is contiguous [b, H, TQ, d]).

    For FP8 inputs this is the gradient w.r.t. the dequantized q (straight-through).
    """
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    start_m = tile * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_valid = offs_m < TQ
    pos_m = tl.load(QPOS + offs_m, mask=m_valid, other=-1)  # global positions (increasing)
    K_bh = K + b * stride_kb + h * stride_kh
    LAB_b = LAB + b * stride_lab_b
    DOC_b = DOC + b * stride_doc_b
    KS_bh = K_SCALE + b * stride_ks_b + h * stride_ks_h

    q, lab_q, doc_q, sq = _load_rows(Q + b * stride_qb + h * stride_qh, LAB_b, DOC_b,
                                     Q_SCALE + b * stride_qs_b + h * stride_qs_h, offs_m, pos_m, m_valid, stride_qt,
                                     stride_qd, stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
                                     HEAD_DIM, HAS_DOC, IS_FP8, True)
    key_start = 0
    if HAS_DOC:
        key_start = tl.load(KEY_START + b * stride_start_b + tile)
    la2, lm2, ga, gm, coef, gap_ok = _load_row_stats(
        LSE_ALL, LSE_MATCH, G_ALL + b * stride_ga_b + h * stride_ga_h, G_MATCH + b * stride_gm_b + h * stride_gm_h,
        pid_bh * TQ + offs_m, offs_m, m_valid, stride_ga_t, stride_gm_t, grad_scale)
    la2 = la2[:, None]
    lm2 = lm2[:, None]
    ga = ga[:, None]
    gm = gm[:, None]
    coef = coef[:, None]

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    key_end = tl.load(QPOS + tl.minimum(start_m + BLOCK_M, TQ) - 1)
    for start_n in range(key_start, key_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < TK
        k, lab_k, doc_k, sk = _load_rows(K_bh, LAB_b, DOC_b, KS_bh, offs_n, offs_n, n_valid, stride_kt, stride_kd,
                                         stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                                         HEAD_DIM, HAS_DOC, IS_FP8, False)
        s = _scores_log2(q, tl.trans(k), sq, sk, qk_scale_log2, IS_FP8, SCORE_MODE, PRECISION)
        cand, match = _pair_masks(pos_m[:, None], offs_n[None, :], lab_q, lab_k, doc_q, doc_k, HAS_DOC)
        ds = _score_grads(s, cand, match, la2, lm2, ga, gm, coef, gap_ok, SHARED_EXP)
        if IS_FP8:
            ds = ds * sk[None, :]  # q_deq . (k_fp8 * sk): fold the key scale into dS, keep k exact
        dq = _grad_dot(ds, k, dq, GRAD_MODE, PRECISION)

    offs_d = tl.arange(0, HEAD_DIM)
    out = DQ + (pid_bh * TQ + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, dq.to(DQ.dtype.element_ty), mask=m_valid[:, None])


@triton.jit
def copy_lse_bwd_dk_kernel(
    Q, K, LAB, DOC, Q_SCALE, K_SCALE, QPOS, QUERY_START, QUERY_END, LSE_ALL, LSE_MATCH, G_ALL, G_MATCH, DK,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_lab_b, stride_lab_t, stride_doc_b, stride_doc_t,
    stride_qs_b, stride_qs_h, stride_qs_blk, stride_ks_b, stride_ks_h, stride_ks_blk,
    q_scale_rows, k_scale_rows, stride_end_b,
    stride_ga_b, stride_ga_h, stride_ga_t, stride_gm_b, stride_gm_h, stride_gm_t,
    H, TQ, TK, qk_scale_log2, grad_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
    IS_FP8: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr, PRECISION: tl.constexpr,
    SHARED_EXP: tl.constexpr,
):
    """One program per (key tile, b*H): dK of BLOCK_N rows (DK contiguous [b, H, TK, d]), streaming the query
    tiles from QUERY_START (per key tile: the first local query past the tile's start, rounded down to a tile).

    Works in the transposed orientation (keys x queries) so that dK = dS^T Q is a plain tl.dot.
    """
    tile = tl.program_id(0)  # early key tiles see the most queries: they start first
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    start_n = tile * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_valid = offs_n < TK
    Q_bh = Q + b * stride_qb + h * stride_qh
    LAB_b = LAB + b * stride_lab_b
    DOC_b = DOC + b * stride_doc_b
    QS_bh = Q_SCALE + b * stride_qs_b + h * stride_qs_h
    GA_bh = G_ALL + b * stride_ga_b + h * stride_ga_h
    GM_bh = G_MATCH + b * stride_gm_b + h * stride_gm_h

    k, lab_k, doc_k, sk = _load_rows(K + b * stride_kb + h * stride_kh, LAB_b, DOC_b,
                                     K_SCALE + b * stride_ks_b + h * stride_ks_h, offs_n, offs_n, n_valid, stride_kt,
                                     stride_kd, stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                                     HEAD_DIM, HAS_DOC, IS_FP8, True)
    query_end = TQ
    if HAS_DOC:
        query_end = tl.minimum(tl.load(QUERY_END + b * stride_end_b + tile), TQ)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    query_start = tl.load(QUERY_START + tile)  # queries t > j >= start_n
    for start_m in range(query_start, query_end, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < TQ
        pos_m = tl.load(QPOS + offs_m, mask=m_valid, other=-1)
        q, lab_q, doc_q, sq = _load_rows(Q_bh, LAB_b, DOC_b, QS_bh, offs_m, pos_m, m_valid, stride_qt, stride_qd,
                                         stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
                                         HEAD_DIM, HAS_DOC, IS_FP8, False)
        la2, lm2, ga, gm, coef, gap_ok = _load_row_stats(LSE_ALL, LSE_MATCH, GA_bh, GM_bh, pid_bh * TQ + offs_m,
                                                         offs_m, m_valid, stride_ga_t, stride_gm_t, grad_scale)

        s_t = _scores_log2(k, tl.trans(q), sk, sq, qk_scale_log2, IS_FP8, SCORE_MODE, PRECISION)
        t_idx = tl.where(m_valid, pos_m, -1)  # rows past TQ: no candidates, no gradient into dK
        cand_t, match_t = _pair_masks(t_idx[None, :], offs_n[:, None], lab_q, lab_k, doc_q, doc_k, HAS_DOC)
        ds_t = _score_grads(s_t, cand_t, match_t, la2[None, :], lm2[None, :], ga[None, :], gm[None, :],
                            coef[None, :], gap_ok, SHARED_EXP)
        if IS_FP8:
            ds_t = ds_t * sq[None, :]  # fold the query scale into dS^T, keep q exact
        dk = _grad_dot(ds_t, q, dk, GRAD_MODE, PRECISION)

    offs_d = tl.arange(0, HEAD_DIM)
    out = DK + (pid_bh * TK + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, dk.to(DK.dtype.element_ty), mask=n_valid[:, None])
