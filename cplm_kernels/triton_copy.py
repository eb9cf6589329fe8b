"""Triton kernels of the fused Copy-Paste scores: forward LSEs, backward row statistics, dQ and dK
(FlashAttention-2 structure).

For each (sequence b, head h) and query t, over the candidates C(t) = {j < t : doc_j == doc_t,
y_j >= 0} and the matching subset M(t) = {j in C(t) : y_j == y_t}:

    lse_all[t]   = logsumexp_{j in C(t)} s_tj          s_tj = <q_t, k_j> * scale
    lse_match[t] = logsumexp_{j in M(t)} s_tj

Forward streams key tiles with online log-sum-exps (log2 domain) and stores only the two floats per row.
Backward recomputes the scores from those statistics: dS_tj = g_all_t * P_all_tj + g_match_t * P_match_tj,
dQ = scale * dS K, dK = scale * dS^T Q. A small kernel first turns (lse, g) into what the gradient kernels read
per row (STATS); dQ (one program per query tile) and dK (one program per key tile) are separate kernels: each
output tile is written exactly once. The alternative, one key-tile kernel adding dQ with atomics, issues
d/BLOCK_N fp32 atomic adds per score into a shared dQ (T=32k, d=128: ~1e9 per head, all contending for the same
rows), needs a zeroed fp32 buffer and is nondeterministic; recomputation costs one more Q K^T on tensor cores
plus the per-score elementwise work in the dQ kernel.

Elementwise work, not matmuls, dominates (one Q K^T per score and no P V, but masks and two log-sum-exps), so the
inner loops keep it to a few instructions per score (sm_90 SASS, d=64: ~15 forward, ~12 in each gradient kernel):

* the per-row shift (a key's label bias: 0, or -inf for an ignored label; minus the row's log2 LSE in the
  backward) is folded into the score's scaling FMA; the causal mask is applied only on the key tiles that
  straddle a query tile's first row (``CAUSAL``), not on the tiles wholly before it; the document mask only with
  documents;
* forward: the matching set's sum shares the candidates' exponentials and running maximum,
  ``l_match = sum_{M(t)} 2^(s - m_all)``. That is exact to fp32 rounding when the row's best matching score lies
  within 2^64 of its best candidate (terms flushed below 2^-126 -- GPUs flush denormals -- then lie 2^-62 below
  the matching set's largest term). A program whose tile holds a row with a larger gap recomputes its matching
  set with the set's own maximum after the loop (one more pass, exact), so nothing underflows that the reference
  keeps, and there is no branch or cross-warp reduction inside the loop;
* backward: under the same condition on a tile's rows (decided once per tile: by the statistics kernel for dK's
  query tiles, once per program in dQ), ``g_match * P_match = coef * P_all`` on matching entries: one exp2 per
  score; tiles with larger gaps take the exact two-exp2 path;
* each gradient kernel streams its varying operand along the MMA's rows (dQ: key tiles, in the transposed
  orientation; dK: query tiles), so what a streamed tile brings per row (labels, documents, statistics) costs two
  loads per thread, not one per column; the transposed dS goes to the gradient matmul through shared memory;
* dK needs no key mask: a key without a label has no candidate pair, so its dK row is zeroed when stored.

Context parallelism: queries may be a subset of the sequence (``HAS_QPOS``). ``QPOS`` (int32 ``[TQ]``, strictly
increasing) gives each query row's global position; keys, labels and document ids cover the whole sequence
(``TK`` rows). Without CP the positions are the rows and ``TQ == TK``. Causal masks, labels and documents use
global positions; q rows, LSEs, incoming gradients and dQ use local rows.

Operand conversions for tl.dot come from :mod:`cplm_kernels.interpreter` as constexpr codes
(0 native, 1 fp32, 2 bf16). FP8 inputs carry per-row scales applied to the fp32 accumulator.
Only plain pointer arithmetic, masks, tl.dot and reductions: stable Triton language features. Helpers are
``@triton.jit`` functions, inlined into each kernel by Triton.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_INF = tl.constexpr(float("-inf"))
# log2 units: with gap <= 64, matching terms within 2^-62 of their own maximum are >= 2^-126 in
# exp2(s - lse_all), i.e. normal fp32 (GPUs flush denormals), so sharing the exponential loses nothing.
SHARED_EXP_MAX_GAP = tl.constexpr(64.0)
N_STATS = 5  # rows of the backward statistics: la2, g_all, g_all + coef, lm2, g_match


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
def _tensor_scales(qk_scale_log2, Q_SCALE, K_SCALE, SCALES: tl.constexpr):
    """FP8 scales by mode -- 0: none (bf16/fp16/fp32 operands); 1: one per tensor, folded here into the score
    scale (returned with q's and k's scales for the gradients); 2: per block of rows, applied per row/column."""
    q_scale = 1.0
    k_scale = 1.0
    if SCALES == 1:
        q_scale = tl.load(Q_SCALE)
        k_scale = tl.load(K_SCALE)
        qk_scale_log2 = qk_scale_log2 * q_scale * k_scale
    return qk_scale_log2, q_scale, k_scale


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
               stride_scale_blk, HEAD_DIM: tl.constexpr, HAS_DOC: tl.constexpr, SCALES: tl.constexpr,
               AS_COLUMN: tl.constexpr):
    """Rows ``rows`` of q or k (at global positions ``pos``) with what the masks and scores need of them: labels
    and document ids shaped for the score tile (document id 0 without documents) and FP8 row scales (1.0
    unless ``SCALES`` is 2: see :func:`_tensor_scales`)."""
    x = _load_tile(X, rows, valid, stride_t, stride_d, HEAD_DIM)
    lab = _column_or_row(tl.load(LAB + pos * stride_lab_t, mask=valid, other=-1), AS_COLUMN)
    doc = 0
    if HAS_DOC:
        doc = _column_or_row(tl.load(DOC + pos * stride_doc_t, mask=valid, other=-1), AS_COLUMN)
    scale = 1.0
    if SCALES == 2:
        scale = _load_row_scales(SCALE, rows, valid, scale_rows, stride_scale_blk)
    return x, lab, doc, scale


@triton.jit
def _positions(QPOS, rows, valid, HAS_QPOS: tl.constexpr):
    """Global positions of local query rows, -1 past TQ: QPOS (context parallelism), else the rows themselves."""
    if HAS_QPOS:
        pos = tl.load(QPOS + rows, mask=valid, other=-1)
    else:
        pos = tl.where(valid, rows, -1)
    return pos


@triton.jit
def _head_bases(X, X_SCALE, LAB, DOC, b, h, stride_xb, stride_xh, stride_sb, stride_sh, stride_lab_b, stride_doc_b):
    """Base pointers of head (b, h)'s rows of q or k and of their FP8 scales, and of sequence b's labels and
    document ids."""
    return (X + b * stride_xb + h * stride_xh, X_SCALE + b * stride_sb + h * stride_sh, LAB + b * stride_lab_b,
            DOC + b * stride_doc_b)


@triton.jit
def _program_rows(X, LAB, DOC, SCALE, POS, H, T, stride_xb, stride_xh, stride_t, stride_d, stride_lab_b,
                  stride_lab_t, stride_doc_b, stride_doc_t, stride_sb, stride_sh, scale_rows, stride_scale_blk,
                  BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_DOC: tl.constexpr, SCALES: tl.constexpr,
                  HAS_QPOS: tl.constexpr, QUERIES: tl.constexpr, AS_COLUMN: tl.constexpr):
    """The tile every kernel's program holds fixed: program axis 1 is (b, h), axis 0 the tile of BLOCK rows of
    ``X`` (q when ``QUERIES``, in reverse order so that long causal rows start first; else k, whose early tiles see
    the most queries). Returns (b*H + h, b, h, tile, rows, valid, global positions, rows of X, labels, document
    ids, FP8 row scales), labels/documents shaped [BLOCK, 1] (``AS_COLUMN``) or [1, BLOCK]."""
    if QUERIES:
        tile = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        tile = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    rows = tile * BLOCK + tl.arange(0, BLOCK)
    valid = rows < T
    if QUERIES:
        pos = _positions(POS, rows, valid, HAS_QPOS)
    else:
        pos = rows
    X_bh, S_bh, LAB_b, DOC_b = _head_bases(X, SCALE, LAB, DOC, b, h, stride_xb, stride_xh, stride_sb, stride_sh,
                                           stride_lab_b, stride_doc_b)
    x, lab, doc, scale = _load_rows(X_bh, LAB_b, DOC_b, S_bh, rows, pos, valid, stride_t, stride_d, stride_lab_t,
                                    stride_doc_t, scale_rows, stride_scale_blk, HEAD_DIM, HAS_DOC, SCALES, AS_COLUMN)
    return pid_bh, b, h, tile, rows, valid, pos, x, lab, doc, scale


@triton.jit
def _key_ranges(QPOS, KEY_START, stride_start_b, b, tile, TQ, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_DOC: tl.constexpr, HAS_QPOS: tl.constexpr):
    """A query tile's key tiles: [lo, mid) lie wholly before its first query (no causal mask), [mid, hi) straddle
    it. lo: the first key tile of the tile's documents (0 without documents); hi: the tile's last position."""
    start_m = tile * BLOCK_M
    lo = 0
    if HAS_DOC:
        lo = tl.load(KEY_START + b * stride_start_b + tile)
    hi = tl.minimum(start_m + BLOCK_M, TQ) - 1  # keys j < t <= the tile's last position
    first = start_m
    if HAS_QPOS:
        hi = tl.load(QPOS + hi)
        first = tl.load(QPOS + first)
    mid = tl.maximum(lo, (first // BLOCK_N) * BLOCK_N)
    return lo, mid, hi


@triton.jit
def _masked_scores(acc, a_scale, b_scale, qk_scale_log2, shift, t, j, doc_t, doc_j, SCALES: tl.constexpr,
                   HAS_DOC: tl.constexpr, CAUSAL: tl.constexpr):
    """log2-domain scores from the ``tl.dot`` accumulator plus ``shift`` (broadcast; one FMA), -inf outside the
    candidate pairs that the causal mask (where ``CAUSAL``) and the document mask (with documents) exclude.
    ``t``/``j``/``doc_*`` are broadcast-shaped; FP8 row (a) and column (b) scales applied when ``SCALES`` is 2."""
    if SCALES == 2:
        s = acc * (a_scale * qk_scale_log2)[:, None] * b_scale[None, :] + shift
    else:
        s = acc * qk_scale_log2 + shift
    if CAUSAL:
        s = tl.where(j < t, s, NEG_INF)
    if HAS_DOC:
        s = tl.where(doc_t == doc_j, s, NEG_INF)
    return s


@triton.jit
def _key_bias(lab_k):
    """0 for keys with a label (possible candidates), -inf for ignored ones."""
    return tl.where(lab_k >= 0, 0.0, NEG_INF)


@triton.jit
def _lse_step(s, m, total):
    """Fold one [M, N] tile of log2 scores into a running (max, sum); also returns the tile's exponentials
    (relative to the new max) and the old sums' rescaling factor."""
    m_new = tl.maximum(m, tl.max(s, 1))
    base = tl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = tl.exp2(m - base)
    p = tl.exp2(s - base[:, None])
    return m_new, total * alpha + tl.sum(p, 1), p, alpha


@triton.jit
def _finish_lse(m, total):
    """Natural-log LSE from a log2-domain (max, sum); an empty set gives -inf."""
    return tl.where(total > 0.0, (m + tl.log2(tl.where(total > 0.0, total, 1.0))) * LN2, NEG_INF)


@triton.jit
def _forward_tiles(q, sq, lab_q, doc_q, pos_m, m_all, l_all, m_match, l_match, lo, hi, K_bh, LAB_b, DOC_b, KS_bh,
                   TK, qk_scale_log2, stride_kt, stride_kd, stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr, SCALES: tl.constexpr,
                   SCORE_MODE: tl.constexpr, PRECISION: tl.constexpr, CAUSAL: tl.constexpr,
                   MATCH_ONLY: tl.constexpr):
    """Stream key tiles [lo, hi): both running LSEs, the matching set's sum sharing the candidates' exponentials
    and maximum (``l_match`` relative to ``m_all``, ``m_match`` its own maximum); ``MATCH_ONLY``: the matching set
    alone with its own maximum (the exact pass; m_all/l_all pass through)."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, lab_k, doc_k, sk = _load_rows(K_bh, LAB_b, DOC_b, KS_bh, offs_n, offs_n, offs_n < TK, stride_kt,
                                         stride_kd, stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                                         HEAD_DIM, HAS_DOC, SCALES, False)
        acc = tl.dot(_dot_operand(q, SCORE_MODE), _dot_operand(tl.trans(k), SCORE_MODE), input_precision=PRECISION)
        s = _masked_scores(acc, sq, sk, qk_scale_log2, _key_bias(lab_k), pos_m[:, None], offs_n[None, :], doc_q,
                           doc_k, SCALES, HAS_DOC, CAUSAL)
        match = lab_q == lab_k
        s_match = tl.where(match, s, NEG_INF)
        if MATCH_ONLY:
            m_match, l_match, _, _ = _lse_step(s_match, m_match, l_match)
        else:
            m_all, l_all, p, alpha = _lse_step(s, m_all, l_all)
            l_match = l_match * alpha + tl.sum(tl.where(match, p, 0.0), 1)
            m_match = tl.maximum(m_match, tl.max(s_match, 1))
    return m_all, l_all, m_match, l_match


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
    HAS_QPOS: tl.constexpr, SCALES: tl.constexpr, SCORE_MODE: tl.constexpr, PRECISION: tl.constexpr,
    SHARED_EXP: tl.constexpr,
):
    """One program per (query tile, b*H): both LSEs of BLOCK_M query rows (outputs contiguous [b, H, TQ])."""
    pid_bh, b, h, tile, offs_m, m_valid, pos_m, q, lab_q, doc_q, sq = _program_rows(
        Q, LAB, DOC, Q_SCALE, QPOS, H, TQ, stride_qb, stride_qh, stride_qt, stride_qd, stride_lab_b, stride_lab_t,
        stride_doc_b, stride_doc_t, stride_qs_b, stride_qs_h, q_scale_rows, stride_qs_blk,
        BLOCK_M, HEAD_DIM, HAS_DOC, SCALES, HAS_QPOS, True, True)
    qk_scale_log2, q_scale, k_scale = _tensor_scales(qk_scale_log2, Q_SCALE, K_SCALE, SCALES)
    lo, mid, hi = _key_ranges(QPOS, KEY_START, stride_start_b, b, tile, TQ, BLOCK_M, BLOCK_N, HAS_DOC, HAS_QPOS)
    K_bh, KS_bh, LAB_b, DOC_b = _head_bases(K, K_SCALE, LAB, DOC, b, h, stride_kb, stride_kh, stride_ks_b,
                                            stride_ks_h, stride_lab_b, stride_doc_b)

    m_all = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_all = tl.zeros([BLOCK_M], tl.float32)
    m_match = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_match = tl.zeros([BLOCK_M], tl.float32)
    for part in tl.static_range(2):  # key tiles before the tile's first query (no causal mask), then the rest
        m_all, l_all, m_match, l_match = _forward_tiles(
            q, sq, lab_q, doc_q, pos_m, m_all, l_all, m_match, l_match, lo if part == 0 else mid,
            mid if part == 0 else hi, K_bh, LAB_b, DOC_b, KS_bh, TK, qk_scale_log2, stride_kt, stride_kd,
            stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
            HEAD_DIM, BLOCK_N, HAS_DOC, SCALES, SCORE_MODE, PRECISION, part == 1, False)
    exact = True
    if SHARED_EXP:
        empty = m_match == NEG_INF
        gap = tl.where(empty, 0.0, m_all - tl.where(empty, 0.0, m_match))  # >= 0: M(t) within C(t)
        exact = tl.max(gap, 0) > SHARED_EXP_MAX_GAP
    lse_match = _finish_lse(m_all, l_match)
    if exact:  # the matching set again with its own maximum (with SHARED_EXP: a score gap above 2^64, rare)
        _, _, m_exact, l_exact = _forward_tiles(
            q, sq, lab_q, doc_q, pos_m, m_all, l_all, tl.full([BLOCK_M], NEG_INF, tl.float32),
            tl.zeros([BLOCK_M], tl.float32), lo, hi, K_bh, LAB_b, DOC_b, KS_bh, TK, qk_scale_log2, stride_kt,
            stride_kd, stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
            HEAD_DIM, BLOCK_N, HAS_DOC, SCALES, SCORE_MODE, PRECISION, True, True)
        lse_match = _finish_lse(m_exact, l_exact)

    out = pid_bh * TQ + offs_m
    tl.store(LSE_ALL + out, _finish_lse(m_all, l_all), mask=m_valid)
    tl.store(LSE_MATCH + out, lse_match, mask=m_valid)


@triton.jit
def copy_lse_bwd_stats_kernel(
    LSE_ALL, LSE_MATCH, G_ALL, G_MATCH, STATS, EXACT,
    stride_ga_b, stride_ga_h, stride_ga_t, stride_gm_b, stride_gm_h, stride_gm_t,
    H, TQ, grad_scale,
    BLOCK: tl.constexpr,
):
    """One program per (tile of BLOCK query rows, b*H): what the gradient kernels read of each row, log2 units,
    gradients times ``grad_scale``, into STATS [N_STATS, b*H*TQ] (see ``_stat``), and into EXACT [b*H, tiles]
    whether the tile holds a row whose gap la2 - lm2 exceeds 2^64 (the exact path). Empty sets get zero
    gradient (never NaN)."""
    tile = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    b = pid_bh // H
    h = pid_bh % H
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    valid = offs < TQ
    rows = pid_bh * TQ + offs
    lse_all = tl.load(LSE_ALL + rows, mask=valid, other=NEG_INF)
    lse_match = tl.load(LSE_MATCH + rows, mask=valid, other=NEG_INF)
    g_all = tl.load(G_ALL + b * stride_ga_b + h * stride_ga_h + offs * stride_ga_t, mask=valid, other=0.0)
    g_match = tl.load(G_MATCH + b * stride_gm_b + h * stride_gm_h + offs * stride_gm_t, mask=valid, other=0.0)
    empty_all = lse_all == NEG_INF
    empty_match = lse_match == NEG_INF
    g_all = tl.where(empty_all, 0.0, g_all.to(tl.float32) * grad_scale)
    g_match = tl.where(empty_match, 0.0, g_match.to(tl.float32) * grad_scale)
    la2 = tl.where(empty_all, 0.0, lse_all * LOG2E)
    lm2 = tl.where(empty_match, 0.0, lse_match * LOG2E)
    gap = tl.where(g_match != 0.0, la2 - lm2, 0.0)  # >= 0 up to rounding: M(t) within C(t)
    coef = g_match * tl.exp2(tl.minimum(gap, SHARED_EXP_MAX_GAP))
    plane = tl.num_programs(1) * TQ
    tl.store(STATS + rows, la2, mask=valid)
    tl.store(STATS + plane + rows, g_all, mask=valid)
    tl.store(STATS + 2 * plane + rows, g_all + coef, mask=valid)
    tl.store(STATS + 3 * plane + rows, gap, mask=valid)
    tl.store(STATS + 4 * plane + rows, g_match, mask=valid)
    tl.store(EXACT + pid_bh * tl.num_programs(0) + tile, (tl.max(gap, 0) > SHARED_EXP_MAX_GAP).to(tl.int32))


@triton.jit
def _stat(STATS_bh, which: tl.constexpr, rows, valid, plane, AS_COLUMN: tl.constexpr):
    """Row statistic ``which`` (0 la2 = lse_all * log2(e); 1 g_all; 2 g_all + coef; 3 gap = la2 - lm2 where
    g_match != 0; 4 g_match) of local query ``rows`` (0 past TQ), shaped [n, 1] or [1, n]."""
    return _column_or_row(tl.load(STATS_bh + which * plane + rows, mask=valid, other=0.0), AS_COLUMN)


@triton.jit
def _score_grads(x, lab_q, lab_k, STATS_bh, rows, valid, plane, AS_COLUMN: tl.constexpr, EXACT: tl.constexpr):
    """dLoss/ds from x = s - la2 (log2 units, -inf outside the candidates), broadcast-shaped labels and the
    queries' statistics: one exp2 per score sharing P_all with the matching set, or (``EXACT``, any gap) one
    per set."""
    g_all = _stat(STATS_bh, 1, rows, valid, plane, AS_COLUMN)
    if EXACT:
        gap = _stat(STATS_bh, 3, rows, valid, plane, AS_COLUMN)
        g_match = _stat(STATS_bh, 4, rows, valid, plane, AS_COLUMN)
        ds = g_all * tl.exp2(x) + g_match * tl.exp2(tl.where(lab_q == lab_k, x + gap, NEG_INF))
    else:
        ds = tl.exp2(x) * tl.where(lab_q == lab_k, _stat(STATS_bh, 2, rows, valid, plane, AS_COLUMN), g_all)
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
def _dq_tiles(dq, q, sq, lab_q, doc_q, pos_m, offs_m, m_valid, la2, STATS_bh, plane, lo, hi, K_bh, LAB_b, DOC_b,
              KS_bh, TK, qk_scale_log2, stride_kt, stride_kd, stride_lab_t, stride_doc_t, k_scale_rows,
              stride_ks_blk, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
              SCALES: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr, PRECISION: tl.constexpr,
              CAUSAL: tl.constexpr, EXACT: tl.constexpr):
    """dq += dS K over key tiles [lo, hi), in the transposed orientation (keys x queries; the queries' vectors
    shaped [1, BLOCK_M]); dS^T reaches the gradient matmul transposed."""
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k, lab_k, doc_k, sk = _load_rows(K_bh, LAB_b, DOC_b, KS_bh, offs_n, offs_n, offs_n < TK, stride_kt,
                                         stride_kd, stride_lab_t, stride_doc_t, k_scale_rows, stride_ks_blk,
                                         HEAD_DIM, HAS_DOC, SCALES, True)
        acc = tl.dot(_dot_operand(k, SCORE_MODE), _dot_operand(tl.trans(q), SCORE_MODE), input_precision=PRECISION)
        x_t = _masked_scores(acc, sk, sq, qk_scale_log2, _key_bias(lab_k) - la2, pos_m[None, :], offs_n[:, None],
                             doc_k, doc_q, SCALES, HAS_DOC, CAUSAL)
        ds_t = _score_grads(x_t, lab_q, lab_k, STATS_bh, offs_m, m_valid, plane, False, EXACT)
        if SCALES == 2:
            ds_t = ds_t * sk[:, None]  # q_deq . (k_fp8 * sk): fold the key scale into dS, keep k exact
        dq = _grad_dot(tl.trans(ds_t), k, dq, GRAD_MODE, PRECISION)
    return dq


@triton.jit
def copy_lse_bwd_dq_kernel(
    Q, K, LAB, DOC, Q_SCALE, K_SCALE, QPOS, KEY_START, STATS, DQ,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_lab_b, stride_lab_t, stride_doc_b, stride_doc_t,
    stride_qs_b, stride_qs_h, stride_qs_blk, stride_ks_b, stride_ks_h, stride_ks_blk,
    q_scale_rows, k_scale_rows, stride_start_b,
    H, TQ, TK, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
    HAS_QPOS: tl.constexpr, SCALES: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr,
    PRECISION: tl.constexpr, SHARED_EXP: tl.constexpr,
):
    """One program per (query tile, b*H): dQ of BLOCK_M rows (DQ is contiguous [b, H, TQ, d]).

    For FP8 inputs this is the gradient w.r.t. the dequantized q (straight-through).
    """
    pid_bh, b, h, tile, offs_m, m_valid, pos_m, q, lab_q, doc_q, sq = _program_rows(
        Q, LAB, DOC, Q_SCALE, QPOS, H, TQ, stride_qb, stride_qh, stride_qt, stride_qd, stride_lab_b, stride_lab_t,
        stride_doc_b, stride_doc_t, stride_qs_b, stride_qs_h, q_scale_rows, stride_qs_blk,
        BLOCK_M, HEAD_DIM, HAS_DOC, SCALES, HAS_QPOS, True, False)
    qk_scale_log2, q_scale, k_scale = _tensor_scales(qk_scale_log2, Q_SCALE, K_SCALE, SCALES)
    lo, mid, hi = _key_ranges(QPOS, KEY_START, stride_start_b, b, tile, TQ, BLOCK_M, BLOCK_N, HAS_DOC, HAS_QPOS)
    K_bh, KS_bh, LAB_b, DOC_b = _head_bases(K, K_SCALE, LAB, DOC, b, h, stride_kb, stride_kh, stride_ks_b,
                                            stride_ks_h, stride_lab_b, stride_doc_b)
    STATS_bh = STATS + pid_bh * TQ
    plane = tl.num_programs(1) * TQ
    la2 = _stat(STATS_bh, 0, offs_m, m_valid, plane, False)
    exact = True
    if SHARED_EXP:
        exact = tl.max(tl.load(STATS_bh + 3 * plane + offs_m, mask=m_valid, other=0.0), 0) > SHARED_EXP_MAX_GAP

    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if exact:
        dq = _dq_tiles(dq, q, sq, lab_q, doc_q, pos_m, offs_m, m_valid, la2, STATS_bh, plane, lo, hi, K_bh, LAB_b,
                       DOC_b, KS_bh, TK, qk_scale_log2, stride_kt, stride_kd, stride_lab_t, stride_doc_t,
                       k_scale_rows, stride_ks_blk, HEAD_DIM, BLOCK_N, HAS_DOC, SCALES, SCORE_MODE, GRAD_MODE,
                       PRECISION, True, True)
    else:
        for part in tl.static_range(2):  # key tiles before the tile's first query (no causal mask), then the rest
            dq = _dq_tiles(dq, q, sq, lab_q, doc_q, pos_m, offs_m, m_valid, la2, STATS_bh, plane,
                           lo if part == 0 else mid, mid if part == 0 else hi, K_bh, LAB_b, DOC_b, KS_bh, TK,
                           qk_scale_log2, stride_kt, stride_kd, stride_lab_t, stride_doc_t, k_scale_rows,
                           stride_ks_blk, HEAD_DIM, BLOCK_N, HAS_DOC, SCALES, SCORE_MODE, GRAD_MODE, PRECISION,
                           part == 1, False)

    offs_d = tl.arange(0, HEAD_DIM)
    out = DQ + (pid_bh * TQ + offs_m)[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(out, (dq * k_scale).to(DQ.dtype.element_ty), mask=m_valid[:, None])  # k_deq = k_fp8 * k_scale


@triton.jit
def _dk_tiles(dk, k, sk, lab_k, doc_k, offs_n, lo, hi, Q_bh, LAB_b, DOC_b, QS_bh, QPOS, STATS_bh, EXACT_bh, plane,
              TQ, qk_scale_log2, stride_qt, stride_qd, stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DOC: tl.constexpr, HAS_QPOS: tl.constexpr,
              SCALES: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr, PRECISION: tl.constexpr,
              CAUSAL: tl.constexpr, SHARED_EXP: tl.constexpr):
    """dk += dS^T Q over query tiles [lo, hi) (queries x keys; the key tile's vectors shaped [1, BLOCK_N]); dS
    reaches the gradient matmul transposed. Keys without a label are not masked here: the caller zeroes their
    rows."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_valid = offs_m < TQ
        pos_m = _positions(QPOS, offs_m, m_valid, HAS_QPOS)
        q, lab_q, doc_q, sq = _load_rows(Q_bh, LAB_b, DOC_b, QS_bh, offs_m, pos_m, m_valid, stride_qt, stride_qd,
                                         stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
                                         HEAD_DIM, HAS_DOC, SCALES, True)
        acc = tl.dot(_dot_operand(q, SCORE_MODE), _dot_operand(tl.trans(k), SCORE_MODE), input_precision=PRECISION)
        x = _masked_scores(acc, sq, sk, qk_scale_log2, -_stat(STATS_bh, 0, offs_m, m_valid, plane, True),
                           pos_m[:, None], offs_n[None, :], doc_q, doc_k, SCALES, HAS_DOC, CAUSAL)
        exact = True
        if SHARED_EXP:
            exact = tl.load(EXACT_bh + start_m // BLOCK_M) != 0
        if exact:
            ds = _score_grads(x, lab_q, lab_k, STATS_bh, offs_m, m_valid, plane, True, True)
        else:
            ds = _score_grads(x, lab_q, lab_k, STATS_bh, offs_m, m_valid, plane, True, False)
        if SCALES == 2:
            ds = ds * sq[:, None]  # fold the query scale into dS, keep q exact
        dk = _grad_dot(tl.trans(ds), q, dk, GRAD_MODE, PRECISION)
    return dk


@triton.jit
def copy_lse_bwd_dk_kernel(
    Q, K, LAB, DOC, Q_SCALE, K_SCALE, QPOS, QUERY_BOUNDS, QUERY_END, STATS, EXACT, DK,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_lab_b, stride_lab_t, stride_doc_b, stride_doc_t,
    stride_qs_b, stride_qs_h, stride_qs_blk, stride_ks_b, stride_ks_h, stride_ks_blk,
    q_scale_rows, k_scale_rows, stride_end_b,
    H, TQ, TK, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DOC: tl.constexpr,
    HAS_QPOS: tl.constexpr, SCALES: tl.constexpr, SCORE_MODE: tl.constexpr, GRAD_MODE: tl.constexpr,
    PRECISION: tl.constexpr, SHARED_EXP: tl.constexpr,
):
    """One program per (key tile, b*H): dK of BLOCK_N rows (DK contiguous [b, H, TK, d]), streaming the query
    tiles that see the key tile: from the first local query past the tile's first key (rounded down to a tile),
    with the causal mask until the first query tile wholly past its last key (rounded up), to the end (with
    documents, QUERY_END: one past the last query of the tile's documents). Under CP both bounds come from
    QUERY_BOUNDS [2, key tiles]; without, from the rows.
    """
    pid_bh, b, h, tile, offs_n, n_valid, _, k, lab_k, doc_k, sk = _program_rows(
        K, LAB, DOC, K_SCALE, QPOS, H, TK, stride_kb, stride_kh, stride_kt, stride_kd, stride_lab_b, stride_lab_t,
        stride_doc_b, stride_doc_t, stride_ks_b, stride_ks_h, k_scale_rows, stride_ks_blk,
        BLOCK_N, HEAD_DIM, HAS_DOC, SCALES, HAS_QPOS, False, False)
    qk_scale_log2, q_scale, k_scale = _tensor_scales(qk_scale_log2, Q_SCALE, K_SCALE, SCALES)
    hi = TQ
    if HAS_DOC:
        hi = tl.minimum(tl.load(QUERY_END + b * stride_end_b + tile), TQ)
    if HAS_QPOS:
        lo = tl.load(QUERY_BOUNDS + tile)
        mid = tl.load(QUERY_BOUNDS + tl.num_programs(0) + tile)
    else:
        lo = ((tile * BLOCK_N + 1) // BLOCK_M) * BLOCK_M  # queries t > j >= start_n
        mid = tl.cdiv((tile + 1) * BLOCK_N, BLOCK_M) * BLOCK_M  # t > every key of the tile
    mid = tl.minimum(mid, hi)
    Q_bh, QS_bh, LAB_b, DOC_b = _head_bases(Q, Q_SCALE, LAB, DOC, b, h, stride_qb, stride_qh, stride_qs_b,
                                            stride_qs_h, stride_lab_b, stride_doc_b)
    EXACT_bh = EXACT + pid_bh * tl.cdiv(TQ, BLOCK_M)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for part in tl.static_range(2):  # query tiles straddling the key tile (causal mask), then those past it
        dk = _dk_tiles(dk, k, sk, lab_k, doc_k, offs_n, lo if part == 0 else mid, mid if part == 0 else hi, Q_bh,
                       LAB_b, DOC_b, QS_bh, QPOS, STATS + pid_bh * TQ, EXACT_bh, tl.num_programs(1) * TQ, TQ,
                       qk_scale_log2, stride_qt, stride_qd, stride_lab_t, stride_doc_t, q_scale_rows, stride_qs_blk,
                       HEAD_DIM, BLOCK_M, HAS_DOC, HAS_QPOS, SCALES, SCORE_MODE, GRAD_MODE, PRECISION, part == 0,
                       SHARED_EXP)

    offs_d = tl.arange(0, HEAD_DIM)
    out = DK + (pid_bh * TK + offs_n)[:, None] * HEAD_DIM + offs_d[None, :]
    dk = tl.where(tl.trans(lab_k) >= 0, dk * q_scale, 0.0)  # q_deq = q_fp8 * q_scale
    tl.store(out, dk.to(DK.dtype.element_ty), mask=n_valid[:, None])
