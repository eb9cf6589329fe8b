"""The fused copy kernels under context parallelism (Triton interpreter): each CP rank's queries (its two chunks
of Megatron's load-balanced split, ``q_positions``) against the whole sequence's keys, labels and documents.

Checked against the naive reference of the whole sequence in fp64 (an independent computation: no positions
involved): every rank's LSEs and dq are the full run's rows, and the rank's dk summed over ranks (what the
all-gather's reduce-scatter does) is the full dk. Tolerances as tests/kernels/test_fused_copy.py (FP32_TOL: fp32
kernel vs exact at T <= 130 terms); the dk sum over N ranks adds N fp32 roundings of terms bounded by the full
dk (N * U32, far below FP32_TOL).
"""
import pytest
import torch

import cplm_kernels as ck
from cplm_megatron.parallel.context import local_positions
from tests.kernels.copy_cases import assert_close_all, make_inputs, outputs_and_grads, random_output_grads
from tests.kernels.test_fused_copy import FP32_TOL, naive_fp64, tiles


def _rank_runs(fn, q, k, n: int, g_all, g_match, **kw):
    """(lse_all, lse_match, dq) of every rank's rows put back in global order, and the ranks' summed dk."""
    T = k.shape[2]
    lse_all, lse_match = torch.empty(g_all.shape), torch.empty(g_all.shape)
    dq, dk = torch.zeros(q.shape, dtype=q.dtype), torch.zeros(k.shape, dtype=k.dtype)
    for r in range(n):
        pos = local_positions(T, n, r)
        qr = q.detach()[:, :, pos].requires_grad_(True)
        kr = k.detach().clone().requires_grad_(True)
        a, m, dqr, dkr = outputs_and_grads(fn, qr, kr, g_all[:, :, pos], g_match[:, :, pos], q_positions=pos, **kw)
        assert a.shape == (q.shape[0], q.shape[1], pos.numel()) and dkr.shape == k.shape
        lse_all[:, :, pos], lse_match[:, :, pos], dq[:, :, pos] = a, m, dqr
        dk += dkr
    return lse_all, lse_match, dq, dk


@pytest.mark.parametrize("n, doc_len, configs", [
    (2, 11, tiles(16, 16)),  # rank rows = 2 chunks of 16: tiles align with the chunks; documents cut tiles
    (2, None, tiles(32, 16)),  # one 32-row query tile holds both chunks (positions jump inside the tile)
    (4, 7, tiles(16, 32)),  # chunks of 8: every query tile straddles two chunks; key tiles wider than query tiles
], ids=["cp2-aligned-docs", "cp2-straddling-causal", "cp4-straddling-docs"])
def test_fused_ranks_equal_the_full_sequence(n, doc_len, configs):
    """Every rank's fused LSEs and dq are the full sequence's rows; the ranks' dk sum is the full dk."""
    q, k, labels, doc_ids = make_inputs(2, 2, 64, 32, doc_len=doc_len, seed=n)
    g_all, g_match = random_output_grads((2, 2, 64), seed=5)
    got = _rank_runs(ck.copy_lse_fused, q, k, n, g_all, g_match, labels=labels, doc_ids=doc_ids, configs=configs)
    ref = outputs_and_grads(naive_fp64, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids)
    assert_close_all(got, ref, FP32_TOL)


@pytest.mark.parametrize("block_rows", [None, 8], ids=["per-tensor", "per-block"])
def test_fp8_ranks_quantize_and_score_like_the_full_sequence(block_rows):
    """FP8 under CP: a rank quantizes its queries with the whole q's amax (``q_amax``; per-block scales whose
    blocks lie inside a CP chunk are the same blocks anyway) and gets the full run's values and straight-through
    gradients, i.e. the reference evaluated on the full run's dequantized inputs."""
    n, T = 2, 64
    q, k, labels, doc_ids = make_inputs(1, 2, T, 32, doc_len=13, seed=9)
    q8, q_scale = ck.quantize_fp8(q, block_rows)
    k8, k_scale = ck.quantize_fp8(k, block_rows)
    q_deq = ck.dequantize_fp8(q8, q_scale, block_rows).requires_grad_()
    k_deq = ck.dequantize_fp8(k8, k_scale, block_rows).requires_grad_()
    g_all, g_match = random_output_grads((1, 2, T), seed=2)
    amax = {"q_amax": q.detach().abs().amax()} if block_rows is None else {}
    got = _rank_runs(ck.copy_lse_fused_fp8, q, k, n, g_all, g_match, labels=labels, doc_ids=doc_ids,
                     block_rows=block_rows, configs=tiles(16, 16), **amax)
    ref = outputs_and_grads(naive_fp64, q_deq, k_deq, g_all, g_match, labels=labels, doc_ids=doc_ids)
    assert_close_all(got, ref, FP32_TOL)  # fp32 q/k: straight-through gradients leave the kernel in fp32


def test_fp8_rank_without_the_global_amax_quantizes_differently():
    """Why ``q_amax`` exists: rank 0's own amax is smaller than the whole q's, so its fp8 values differ."""
    q, k, labels, _ = make_inputs(1, 1, 32, 32, doc_len=None, seed=3)
    pos = local_positions(32, 2, 0)
    q = q.detach().clone()
    q[:, :, 20] *= 4.0  # the largest entry sits in rank 1's rows
    own = ck.quantize_fp8(q[:, :, pos])[0].float()
    shared = ck.quantize_fp8(q[:, :, pos], amax=q.abs().amax())[0].float()
    assert not torch.equal(own, shared)
    assert torch.equal(shared, ck.quantize_fp8(q)[0].float()[:, :, pos])


def test_bad_positions_raise_clear_errors():
    q, k, labels, _ = make_inputs(1, 1, 32, 32, doc_len=None)
    pos = local_positions(32, 2, 0)
    qr = q.detach()[:, :, pos]
    with pytest.raises(ValueError, match=r"q_positions must be an integer tensor of shape \[Tq\] = \[16\]"):
        ck.copy_lse_fused(qr, k, labels, q_positions=pos[:8])
    with pytest.raises(ValueError, match=r"strictly increasing global positions in \[0, 32\)"):
        ck.copy_lse_fused(qr, k, labels, q_positions=pos.flip(0))
    with pytest.raises(ValueError, match=r"strictly increasing global positions in \[0, 32\)"):
        ck.copy_lse_fused(qr, k, labels, q_positions=pos + 20)
    with pytest.raises(ValueError, match=r"q and k must both be \[b, H, Tq / T, d\]"):
        ck.copy_lse_fused(qr, k[:, :, :, :16], labels, q_positions=pos)
    with pytest.raises(ValueError, match="q_amax is the per-tensor amax: it needs block_rows=None"):
        ck.copy_lse_fused_fp8(qr, k, labels, q_positions=pos, block_rows=8, q_amax=q.abs().amax())
