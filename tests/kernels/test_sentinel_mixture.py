"""`copy_head.mixing: sentinel` through the naive, chunked and fused (Triton interpreter) paths against an
independent float64 implementation of the pointer-sentinel mixture written here (dense masked scores, no
project function): the loss and its gradients w.r.t. the hidden states, the sentinel weights and bias, the
copy projections and the LM cross entropy; positions without candidates get g = 0 exactly; the fused
backward's lse term (dL/dlse^c_t * a^c_tj added to the score gradients) on its own.
"""
import math

import pytest
import torch

import cplm_kernels as ck
from cplm_megatron.model.copy_head import CopyHeadConfig, CopyPasteHead
from tests.kernels.copy_cases import make_inputs, rel_err

HID, H, D, S = 32, 2, 32, 40  # head_dim 32: a fused-kernel size; T = 40 keeps the interpreter fast
U32 = 2.0**-24
# naive/chunked run the whole head in fp64: sums of <= 40 scores, 32-term projections and the mixture's
# log/exp chain round at ~100 * 2^-53 ~ 1e-14 relative; 1e-10 leaves room and catches any formula error
FP64_TOL = 1e-10
# fused runs the kernels in fp32 (values and gradients within FP32_TOL = 1e-5 of exact, tests/kernels/
# test_fused_copy.py) while the projections and the mixture run in fp32 too: 32-term projections round at
# ~32 * U32 ~ 2e-6 relative, the sentinel/mixture chain adds a few ulps, and the gradient w.r.t. the hidden
# states and weights sums those over b * T = 80 positions (~80 * U32 ~ 5e-6): ~2e-5 in all -> 5e-5
FUSED_TOL = 5e-5


def sentinel_reference(hidden, wq, wk, wg, bg, lm_ce, labels, mask, doc):
    """Per-token -log p(y_t) of p = (1 - g) p_LM + g p_copy with g = mean_c sigmoid(lse^c - sigma^c), in fp64."""
    b, s, _ = hidden.shape
    q = (hidden @ wq.T).view(b, s, H, D).transpose(1, 2)
    k = (hidden @ wk.T).view(b, s, H, D).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)  # [b, H, t, j]
    valid = (labels >= 0) & (mask > 0)
    pos = torch.arange(s)
    cand = (pos[None, :] < pos[:, None])[None] & valid[:, None, :] & (doc[:, :, None] == doc[:, None, :])
    has = cand.any(-1)  # [b, t]
    lse = torch.logsumexp(torch.where(cand[:, None], scores, -torch.inf), -1)  # -inf without candidates
    lse_safe = torch.where(has[:, None], lse, 0.0)
    attn = torch.where(cand[:, None], torch.exp(scores - lse_safe[..., None]), 0.0)  # softmax over C(t)
    match = cand & (labels[:, None, :] == labels[:, :, None])
    p_copy = (attn * match[:, None]).sum(-1).mean(1)  # [b, t]
    sigma = hidden @ wg.T + bg  # [b, t, H]
    g = torch.where(has, torch.sigmoid(lse_safe.transpose(1, 2) - sigma).mean(-1), 0.0)
    return -torch.log((1 - g) * torch.exp(-lm_ce) + g * p_copy), g, has


def _case(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, S, HID, generator=gen)
    labels = torch.randint(0, 6, (2, S), generator=gen)  # small alphabet: many matches
    labels[0, 7] = -100
    mask = torch.ones(2, S)
    mask[1, :5] = 0  # masked history: no candidates before position 5 in row 1
    doc = torch.zeros(2, S, dtype=torch.long)
    doc[0, 25:] = 1  # a document start at 25
    lm_ce = torch.rand(2, S, generator=gen) * 4
    return hidden, labels, mask, doc, lm_ce


def _head(impl: str, dtype: torch.dtype) -> CopyPasteHead:
    torch.manual_seed(3)
    head = CopyPasteHead(HID, CopyHeadConfig(heads=H, head_dim=D, mixing="sentinel", impl=impl, block_size=16),
                         init_std=0.15)
    with torch.no_grad():
        head.gate.weight.normal_(0.0, 0.3)
        head.gate.bias.copy_(torch.tensor([1.0, 2.5]))  # sentinels near the candidates' lse: g spread over (0, 1)
    return head.to(dtype)


@pytest.mark.parametrize("impl, dtype, tol", [("naive", torch.float64, FP64_TOL), ("chunked", torch.float64, FP64_TOL),
                                              ("fused", torch.float32, FUSED_TOL)])
def test_sentinel_loss_and_gradients_match_an_independent_fp64_reference(impl, dtype, tol):
    hidden, labels, mask, doc, lm_ce = _case()
    head = _head(impl, dtype)
    h = hidden.to(dtype).requires_grad_()
    ce = lm_ce.to(dtype).requires_grad_()
    out = head(h, ce, labels, mask, doc, impl=impl)
    scored = (labels >= 0) & (mask > 0)
    loss = torch.where(scored, out.loss, 0.0).sum()
    params = [head.gate.weight, head.gate.bias, head.q_proj.weight, head.k_proj.weight]
    got = torch.autograd.grad(loss, [h, ce, *params])

    ref_inputs = [x.detach().double().requires_grad_() for x in (h, *params, ce)]
    rh, rwg, rbg, rwq, rwk, rce = ref_inputs
    ref_nll, ref_g, has = sentinel_reference(rh, rwq, rwk, rwg, rbg, rce, labels, mask, doc)
    ref_loss = torch.where(scored, ref_nll, 0.0).sum()
    expected = torch.autograd.grad(ref_loss, [rh, rce, rwg, rbg, rwq, rwk])

    assert ref_g[has].max() - ref_g[has].min() > 0.3  # g varies with the evidence: not saturated at 0 or 1
    assert rel_err(out.loss.detach()[scored], ref_nll.detach()[scored]) <= tol
    assert rel_err(out.gate.detach(), ref_g.detach()) <= tol
    names = ["hidden", "lm_ce", "sentinel weight", "sentinel bias", "q_proj", "k_proj"]
    for name, a, e in zip(names, got, expected):
        assert e.abs().max() > 0, name  # every input really carries gradient
        err = rel_err(a, e)
        assert err <= tol, f"{impl}: d loss / d {name}: relative error {err:.2e} > {tol:.0e}"
    # no candidate -> g = 0 exactly and the loss is the LM cross entropy itself (bitwise: the mixture adds log 1)
    none = ~out.has_candidate
    assert torch.equal(none, ~has) and none[:, 0].all() and none[0, 25] and none[1, :6].all()
    assert (out.gate[none] == 0).all() and torch.equal(out.loss[none], ce[none].to(out.loss.dtype))


def test_fused_backward_lse_term_alone():
    """Upstream gradient on lse_all only (what the sentinel adds): dq_t = scale * sum_j g_t a_tj k_j and
    dk_j = scale * sum_t g_t a_tj q_t with a the softmax over C(t), computed here in fp64."""
    q, k, labels, doc_ids = make_inputs(2, 2, 70, 32, seed=21)
    g_all = torch.randn(2, 2, 70, generator=torch.Generator().manual_seed(22))
    lse_all, lse_match = ck.copy_lse_fused(q, k, labels, doc_ids)
    dq, dk = torch.autograd.grad((torch.where(torch.isfinite(lse_all), lse_all, 0.0) * g_all).sum(), (q, k))

    scale = 1.0 / math.sqrt(32)
    q64, k64 = q.detach().double(), k.detach().double()
    s = q64 @ k64.transpose(-1, -2) * scale
    pos = torch.arange(70)
    cand = (pos[None, :] < pos[:, None])[None] & (labels[:, None, :] >= 0) & (doc_ids[:, :, None] == doc_ids[:, None, :])
    has = cand.any(-1)[:, None]  # [b, 1, t]
    lse = torch.logsumexp(torch.where(cand[:, None], s, -torch.inf), -1)  # [b, H, t]
    attn = torch.where(cand[:, None], torch.exp(s - torch.where(has, lse, 0.0)[..., None]), 0.0)
    ds = g_all.double()[..., None] * attn * scale
    # fp32 kernel vs exact: FP32_TOL of tests/kernels/test_fused_copy.py (T = 70, unit-variance q, k)
    assert rel_err(lse_all.detach(), lse) <= 1e-5
    assert rel_err(dq, ds @ k64) <= 1e-5 and rel_err(dk, ds.transpose(-1, -2) @ q64) <= 1e-5
    assert torch.isfinite(lse_match).any()
