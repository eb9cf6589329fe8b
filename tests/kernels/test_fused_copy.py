"""Fused Triton copy kernels (CPU interpreter) against the naive PyTorch reference evaluated in fp64 on
the same input values (the exact function up to fp64 rounding).

Tolerances (relative: max abs error / max abs reference): fp32 1e-5, bf16/fp16 2e-2; FP8 equals
the reference evaluated on the dequantized inputs (1e-5).
"""
import pytest
import torch

import cplm_kernels as ck
from cplm_kernels.configs import SMALL_GRID_ROWS, KernelConfigs, TileConfig, select_configs
from tests.kernels.copy_cases import (
    assert_close_all,
    make_inputs,
    outputs_and_grads,
    random_output_grads,
    rel_err,
)

U32 = 2.0**-24  # fp32 unit roundoff
# fp32 kernel vs exact, unit-variance q, k (|s| = |q.k|/sqrt(d) <~ 5): sums over T <= 130 terms round by at
# most 130 * U32 ~ 7.7e-6 relative, and each exp(s - lse) carries the absolute rounding of s, lse and their
# difference (~4 * 5 * U32 ~ 1.2e-6) as relative error -> 1e-5
FP32_TOL = 1e-5
# bf16/fp16 inputs: the kernel rounds dS to the input dtype for the gradient matmuls (2^-8 relative per term
# in bf16) and returns dq, dk in that dtype (another 2^-8 ~ 3.9e-3): a few bf16 ulps -> 2e-2
HALF_TOL = 2e-2


def tiles(block_m: int, block_n: int, shared_exp: bool = True) -> KernelConfigs:
    """The same tile for the three kernels (forward, dQ, dK)."""
    t = TileConfig(block_m, block_n, num_warps=1, num_stages=1, shared_exp=shared_exp)
    return KernelConfigs(t, t, t)


def naive_fp64(q, k, *args, **kwargs):
    """The naive reference on the same values in fp64 (gradients flow back to q, k, rounded once)."""
    return ck.copy_lse_naive(q.double(), k.double(), *args, **kwargs)


def compare(q, k, labels, doc_ids, tol, scale=None, configs=None, seed=1):
    g_all, g_match = random_output_grads(labels.shape[:1] + q.shape[1:3], seed)
    fused = outputs_and_grads(ck.copy_lse_fused, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids,
                              scale=scale, configs=configs)
    ref = outputs_and_grads(naive_fp64, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids, scale=scale)
    assert fused[2].dtype == q.dtype and fused[3].dtype == k.dtype
    assert_close_all(fused, ref, tol)
    return fused, ref


@pytest.mark.parametrize(
    "b, H, T, d, doc_len, configs",
    [
        (2, 2, 100, 32, 23, tiles(16, 32)),  # T not a multiple of either tile; documents cut tiles
        (1, 3, 70, 32, None, tiles(32, 16)),  # one document per row, block_m > block_n
        (1, 2, 130, 64, 40, None),  # interpreter default tiles, T = 2 * 64 + 2
        (1, 1, 96, 128, 30, tiles(32, 32)),
        (2, 1, 1, 32, 5, None),  # T = 1: nothing to attend to
        (1, 1, 17, 64, None, tiles(16, 16)),  # a single partial tile beyond the first
    ],
)
def test_fp32_matches_reference(b, H, T, d, doc_len, configs):
    q, k, labels, doc_ids = make_inputs(b, H, T, d, doc_len=doc_len, seed=T + d)
    compare(q, k, labels, doc_ids, FP32_TOL, configs=configs)


def test_gpu_table_buckets():
    """The GPU table: 64-row forward tiles only below SMALL_GRID_ROWS query rows, 64 x 64 gradient tiles, small
    fp32 tiles; the interpreter always takes its one entry."""
    for d in (32, 64, 128):
        large = select_configs(d, torch.bfloat16, interpret=False, rows=SMALL_GRID_ROWS)
        small = select_configs(d, torch.float8_e4m3fn, interpret=False, rows=SMALL_GRID_ROWS - 1)
        assert (large.forward.block_m, small.forward.block_m) == (128, 64)
        assert large.grad_q == large.grad_k == small.grad_q == TileConfig(64, 64, 4, 2)
        assert select_configs(d, torch.float32, interpret=False, rows=1 << 20).forward.block_m <= 32
        assert select_configs(d, torch.bfloat16, interpret=True, rows=1 << 20) == select_configs(
            d, torch.float32, interpret=True, rows=1)


@pytest.mark.parametrize("rows", [SMALL_GRID_ROWS, 1])
def test_gpu_table_tiles_match_reference(rows):
    """The GPU table's tile shapes (both grid sizes) in the interpreter: T = 160 spans query tiles whose key
    tiles lie before the tile (no causal mask), straddle it, and hold a partial last tile."""
    table = select_configs(64, torch.bfloat16, interpret=False, rows=rows)
    configs = KernelConfigs(*(TileConfig(t.block_m, t.block_n, 1, 1) for t in (table.forward, table.grad_q,
                                                                               table.grad_k)))
    q, k, labels, doc_ids = make_inputs(1, 2, 160, 64, doc_len=90, seed=21)
    compare(q, k, labels, doc_ids, FP32_TOL, configs=configs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_reference(dtype):
    q, k, labels, doc_ids = make_inputs(1, 2, 90, 64, dtype=dtype, seed=3)
    compare(q, k, labels, doc_ids, HALF_TOL, configs=tiles(32, 32))


def test_no_candidates_anywhere_gives_minus_inf_and_zero_grads():
    q, k, labels, _ = make_inputs(1, 2, 40, 32, doc_len=None)
    cases = {
        "all labels ignored": (torch.full_like(labels, -100), None),
        "one document per position": (labels, torch.arange(40)[None]),
    }
    for name, (lab, docs) in cases.items():
        (lse_all, lse_match, dq, dk), _ = compare(q, k, lab, docs, FP32_TOL, configs=tiles(16, 16))
        assert torch.isneginf(lse_all).all() and torch.isneginf(lse_match).all(), name
        # bitwise: with no candidate nothing is accumulated
        assert torch.equal(dq, torch.zeros_like(dq)) and torch.equal(dk, torch.zeros_like(dk)), name


def test_every_candidate_matching_gives_equal_lses():
    q, k, labels, doc_ids = make_inputs(1, 2, 75, 32, seed=5)
    labels = torch.where(labels >= 0, 7, labels)  # every valid candidate proposes the query's label
    labels[:, 0] = 7
    (lse_all, lse_match, _, _), _ = compare(q, k, labels, doc_ids, FP32_TOL, configs=tiles(32, 16))
    valid = labels[:, None, :].expand_as(lse_all) >= 0
    # bitwise: every candidate matches, so both outputs are the same sums in the same order
    assert torch.equal(lse_all[valid], lse_match[valid])


def test_large_score_gap_takes_the_exact_path():
    """Matches score ~120 nats below the other candidates: exp(s - lse_all) underflows for them,
    so the shared-exponential shortcut must step aside (in forward and in both backward kernels)."""
    T, d = 48, 32
    gen = torch.Generator().manual_seed(12)
    labels = (torch.arange(T) % 2)[None]
    sign = 1.0 - 2.0 * labels[0, :, None].float()  # +1 for label 0, -1 for label 1
    u = torch.zeros(d)
    u[0] = 1.0
    scale = 1.0 / d**0.5
    q = (-sign * u * 60.0 * d**0.25 + 0.1 * torch.randn(T, d, generator=gen))[None, None].requires_grad_()
    k = (sign * u * d**0.25 + 0.1 * torch.randn(T, d, generator=gen))[None, None].requires_grad_()
    # |s| reaches ~66 here: the absolute rounding of s, lse and s - lse (~4 * |s| * U32) becomes relative
    # error of every exp(s - lse), on top of FP32_TOL's
    tol = FP32_TOL + 4 * U32 * (scale * q[0, 0] @ k[0, 0].T).abs().max().item()
    for shared in (True, False):
        (lse_all, lse_match, _, _), _ = compare(q, k, labels, None, tol, scale=scale,
                                                configs=tiles(16, 16, shared_exp=shared))
        gap = (lse_all - lse_match)[torch.isfinite(lse_match)]
        assert gap.min() > 100.0, "inputs do not exercise the large-gap path"


def test_gradient_through_one_output_only():
    q, k, labels, doc_ids = make_inputs(1, 2, 50, 32, seed=11)
    for pick in (0, 1):
        fused = ck.copy_lse_fused(q, k, labels, doc_ids, configs=tiles(16, 32))[pick]
        ref = naive_fp64(q, k, labels, doc_ids)[pick]
        grads = [torch.autograd.grad(torch.where(torch.isfinite(o), o, 0.0).sum(), (q, k)) for o in (fused, ref)]
        for a, e in zip(*grads):
            assert rel_err(a, e) <= FP32_TOL


def test_strided_views_of_a_sequence_major_projection():
    """q, k as [b, H, T, d] views of [T, b, H * d] (how the head calls it): no copy needed."""
    T, b, H, d = 45, 2, 2, 32
    gen = torch.Generator().manual_seed(2)
    proj = torch.randn(T, b, 2 * H * d, generator=gen, requires_grad=True)
    q = proj[..., : H * d].reshape(T, b, H, d).permute(1, 2, 0, 3)
    k = proj[..., H * d:].reshape(T, b, H, d).permute(1, 2, 0, 3)
    assert not q.is_contiguous()
    _, _, labels, doc_ids = make_inputs(b, H, T, d, seed=2)
    outs = [f(q, k, labels, doc_ids) for f in (ck.copy_lse_fused, naive_fp64)]
    grads = [torch.autograd.grad(sum(torch.where(torch.isfinite(o), o, 0.0).sum() for o in out), proj)[0]
             for out in outs]
    for a, e in zip((*outs[0], grads[0]), (*outs[1], grads[1])):
        assert rel_err(a.detach(), e.detach()) <= FP32_TOL


def test_non_contiguous_document_ids():
    """Document ids need not form runs: tile-skipping bounds must stay conservative."""
    q, k, labels, _ = make_inputs(2, 1, 80, 32, doc_len=None, seed=4)
    doc_ids = (torch.arange(80)[None].expand(2, 80) // 7) % 3  # three interleaved documents
    compare(q, k, labels, doc_ids, FP32_TOL, configs=tiles(16, 16))


@pytest.mark.parametrize("block_rows", [None, 32])
def test_fp8_straight_through_matches_reference_on_dequantized_inputs(block_rows):
    q, k, labels, doc_ids = make_inputs(1, 2, 70, 64, dtype=torch.bfloat16, seed=6)
    q8, q_scale = ck.quantize_fp8(q, block_rows)
    k8, k_scale = ck.quantize_fp8(k, block_rows)
    q_deq = ck.dequantize_fp8(q8, q_scale, block_rows).requires_grad_()
    k_deq = ck.dequantize_fp8(k8, k_scale, block_rows).requires_grad_()
    g_all, g_match = random_output_grads((1, 2, 70))
    fused = outputs_and_grads(ck.copy_lse_fused_fp8, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids,
                              block_rows=block_rows, configs=tiles(32, 16))
    ref = outputs_and_grads(naive_fp64, q_deq, k_deq, g_all, g_match, labels=labels, doc_ids=doc_ids)
    assert fused[2].dtype == torch.bfloat16  # gradients in the unquantized inputs' dtype
    # the dequantized fp8 values are exact in fp32, so the values follow FP32_TOL; the gradients leave the
    # kernel as bf16 (rounding 2^-8 ~ 3.9e-3 relative, compared after rounding the reference too): 1e-2
    assert_close_all(fused[:2], ref[:2], FP32_TOL)
    assert_close_all(fused[2:], tuple(g.to(torch.bfloat16) for g in ref[2:]), 1e-2, names=("dq", "dk"))
    values = ck.copy_lse_fused(q8, k8, labels, doc_ids, q_scale=q_scale, k_scale=k_scale,
                               scale_block_rows=block_rows or 128, configs=tiles(16, 32))
    assert_close_all(values, ref[:2], FP32_TOL)


def test_fp8_fp32_gradients_are_exact_straight_through():
    q, k, labels, doc_ids = make_inputs(1, 1, 50, 32, seed=8)
    q8, q_scale = ck.quantize_fp8(q)
    k8, k_scale = ck.quantize_fp8(k)
    q_deq = ck.dequantize_fp8(q8, q_scale).requires_grad_()
    k_deq = ck.dequantize_fp8(k8, k_scale).requires_grad_()
    g_all, g_match = random_output_grads((1, 1, 50))
    fused = outputs_and_grads(ck.copy_lse_fused_fp8, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids)
    ref = outputs_and_grads(naive_fp64, q_deq, k_deq, g_all, g_match, labels=labels, doc_ids=doc_ids)
    assert fused[2].dtype == torch.float32
    assert_close_all(fused, ref, FP32_TOL)


def test_bad_inputs_raise_clear_errors():
    q, k, labels, _ = make_inputs(1, 1, 20, 32, doc_len=None)
    with pytest.raises(ValueError, match="copy_lse_chunked"):
        ck.copy_lse_fused(q[..., :24], k[..., :24], labels)
    with pytest.raises(ValueError, match=r"labels must be an integer tensor of shape \[b, T\]"):
        ck.copy_lse_fused(q, k, labels[:, :10])
    with pytest.raises(ValueError, match="only for float8"):
        ck.copy_lse_fused(q, k, labels, q_scale=torch.tensor(1.0), k_scale=torch.tensor(1.0))
    q8, q_scale = ck.quantize_fp8(q, block_rows=8)
    k8, k_scale = ck.quantize_fp8(k, block_rows=8)
    with pytest.raises(ValueError, match="need q_scale and k_scale"):
        ck.copy_lse_fused(q8, k8, labels)
    with pytest.raises(ValueError, match="scale_block_rows=128"):
        ck.copy_lse_fused(q8, k8, labels, q_scale=q_scale, k_scale=k_scale)
    with pytest.raises(ValueError, match="copy_lse_fused_fp8"):
        ck.copy_lse_fused(q8.requires_grad_(), k8, labels, q_scale=q_scale, k_scale=k_scale, scale_block_rows=8)
