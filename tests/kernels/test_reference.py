"""The PyTorch references: naive against an explicit loop, chunked against naive (values and grads)."""
import math

import pytest
import torch

from cplm_kernels import copy_lse_chunked, copy_lse_naive
from tests.kernels.copy_cases import (
    assert_close_all,
    make_inputs,
    outputs_and_grads,
    random_output_grads,
)


def loop_reference(q, k, labels, doc_ids, scale):
    """Definition of docs/design.md written as loops over (b, h, t, j), in fp64."""
    b, H, T, _ = q.shape
    lse_all = torch.full((b, H, T), -math.inf, dtype=torch.float64)
    lse_match = lse_all.clone()
    for bi in range(b):
        for h in range(H):
            for t in range(T):
                cand = [j for j in range(t) if labels[bi, j] >= 0
                        and (doc_ids is None or doc_ids[bi, j] == doc_ids[bi, t])]
                match = [j for j in cand if labels[bi, j] == labels[bi, t]]
                s = {j: float(q[bi, h, t].double() @ k[bi, h, j].double()) * scale for j in cand}
                if cand:
                    lse_all[bi, h, t] = torch.logsumexp(torch.tensor([s[j] for j in cand], dtype=torch.float64), 0)
                if match:
                    lse_match[bi, h, t] = torch.logsumexp(torch.tensor([s[j] for j in match], dtype=torch.float64), 0)
    return lse_all, lse_match


def test_naive_matches_the_definition():
    q, k, labels, doc_ids = make_inputs(2, 2, 19, 8, doc_len=6, seed=0)
    scale = 1 / math.sqrt(8)
    expected = loop_reference(q.detach(), k.detach(), labels, doc_ids, scale)
    actual = copy_lse_naive(q.detach().double(), k.detach().double(), labels, doc_ids)
    for a, e in zip(actual, expected):
        # boolean pattern: -inf marks empty candidate sets
        assert torch.equal(torch.isinf(a), torch.isinf(e))
        # both fp64 over <= 19 candidates of 8-dim scores: ~19 * 2^-53 ~ 2e-15; 1e-12 catches any formula error
        assert torch.allclose(a[torch.isfinite(a)], e[torch.isfinite(e)], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T, block, doc_len", [(50, 16, 9), (64, 64, None), (1, 128, 3), (37, 128, 5)])
def test_chunked_equals_naive(T, block, doc_len):
    q, k, labels, doc_ids = make_inputs(2, 3, T, 16, doc_len=doc_len, seed=T)
    g_all, g_match = random_output_grads((2, 3, T))
    chunked = outputs_and_grads(copy_lse_chunked, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids, block=block)
    naive = outputs_and_grads(copy_lse_naive, q, k, g_all, g_match, labels=labels, doc_ids=doc_ids)
    # fp32 vs fp32, sums over T <= 64 in blocks vs whole rows, unit-variance scores (|s| <~ 4): random-walk
    # rounding ~sqrt(64) * 2^-24 ~ 5e-7 relative each -> 1e-6
    assert_close_all(chunked, naive, 1e-6)


def test_chunked_gradcheck_fp64():
    q, k, labels, doc_ids = make_inputs(1, 2, 12, 4, doc_len=4, seed=3)
    q = q.detach().double().requires_grad_()
    k = k.detach().double().requires_grad_()

    def finite_outputs(q, k):
        la, lm = copy_lse_chunked(q, k, labels, doc_ids, block=5)
        return torch.where(torch.isfinite(la), la, 0.0), torch.where(torch.isfinite(lm), lm, 0.0)

    assert torch.autograd.gradcheck(finite_outputs, (q, k))
