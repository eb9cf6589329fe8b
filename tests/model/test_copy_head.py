"""The Copy-Paste head against its contract (docs/design.md): implementations, causality, edge positions."""
import math

import pytest
import torch

from cplm_megatron.model.copy_head import CopyHeadConfig, CopyPasteHead

H, D, HID = 3, 8, 32


def _case(seed=0, b=2, s=45):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, s, HID, generator=g)
    lm_ce = torch.rand(b, s, generator=g) * 5 + 0.5
    labels = torch.randint(0, 6, (b, s), generator=g)
    labels[0, 10] = -100  # ignored label
    mask = torch.ones(b, s)
    mask[-1, -5:] = 0  # padding
    doc = torch.zeros(b, s, dtype=torch.long)
    doc[:, 20:] = 1
    doc[-1, 33:] = 2
    return hidden, lm_ce, labels, mask, doc


def _head(qk_norm=False, **kw):
    torch.manual_seed(0)
    return CopyPasteHead(HID, CopyHeadConfig(heads=H, head_dim=D, qk_norm=qk_norm, block_size=7, **kw), init_std=0.5)


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("aux", [False, True])
def test_chunked_equals_naive_values_and_gradients(qk_norm, aux):
    kw = dict(lm_loss_weight=0.3, copy_loss_weight=0.2) if aux else {}
    head = _head(qk_norm, **kw)
    hidden, lm_ce, labels, mask, doc = _case()
    results = {}
    for impl in ("naive", "chunked"):
        head.zero_grad()
        h = hidden.clone().requires_grad_(True)
        ce = lm_ce.clone().requires_grad_(True)
        out = head(h, ce, labels, mask, doc, impl=impl)
        (out.loss * mask).sum().backward()
        results[impl] = (out.loss.detach(), h.grad, ce.grad, {n: p.grad.clone() for n, p in head.named_parameters()})
    (l1, gh1, gce1, gp1), (l2, gh2, gce2, gp2) = results["naive"], results["chunked"]
    assert torch.isfinite(l1).all() and torch.isfinite(gh1).all()
    # fp32 vs fp32, sums over rows of 45 positions in two orders (blocks of 7 vs whole rows), values and
    # gradients up to ~12: random-walk rounding sqrt(45) * 2^-24 * 12 ~ 5e-6 (observed <= 7e-7) -> 1e-5
    torch.testing.assert_close(l2, l1, rtol=0, atol=1e-5)
    torch.testing.assert_close(gh2, gh1, rtol=0, atol=1e-5)
    torch.testing.assert_close(gce2, gce1, rtol=0, atol=1e-5)
    for name in gp1:
        torch.testing.assert_close(gp2[name], gp1[name], rtol=0, atol=1e-5, msg=name)
    assert gp1["q_proj.weight"].abs().sum() > 0  # the copy path really carries gradient


def test_loss_matches_a_direct_implementation_of_the_contract():
    """An independent, loop-based computation of the formulas of docs/design.md (float64)."""
    head = _head().double()
    hidden, lm_ce, labels, mask, doc = _case(seed=1, b=1, s=30)
    hidden, lm_ce = hidden.double(), lm_ce.double()
    out = head(hidden, lm_ce, labels, mask, doc, impl="naive")
    q, k = head.queries_keys(hidden)
    z = head.gate_logits(hidden)
    for t in range(30):
        if mask[0, t] == 0 or labels[0, t] < 0:
            continue  # no loss there
        cands = [j for j in range(t) if doc[0, j] == doc[0, t] and labels[0, j] >= 0 and mask[0, j] > 0]
        if not cands:
            assert out.gate[0, t] == 0 and out.loss[0, t] == lm_ce[0, t]
            continue
        p_copy = 0.0
        for c in range(H):
            s = torch.stack([q[0, c, t] @ k[0, c, j] / math.sqrt(D) for j in cands])
            a = torch.softmax(s, 0)
            p_copy += sum(a[i] for i, j in enumerate(cands) if labels[0, j] == labels[0, t]) / H
        g = torch.sigmoid(z[0, t])
        p = (1 - g) * torch.exp(-lm_ce[0, t]) + g * p_copy
        # both in fp64 over <= 30 candidates: ~30 * 2^-53 ~ 3e-15 relative; 1e-9 leaves room for log/exp of the
        # gate and the LM term, and still catches any formula error
        assert out.loss[0, t].item() == pytest.approx(-math.log(p.item()), rel=1e-9, abs=1e-9)


def test_gate_bias_init_and_parameter_count():
    head = CopyPasteHead(576, CopyHeadConfig(heads=4, head_dim=64))
    assert head.gate.bias.item() == -2.0
    assert sum(p.numel() for p in head.parameters()) == 2 * 576 * 4 * 64 + 576 + 1


def test_constant_mixing_ignores_hidden_states():
    head = _head(mixing="constant")
    hidden, lm_ce, labels, mask, doc = _case()
    out = head(hidden, lm_ce, labels, mask, doc, impl="chunked")
    gates = out.gate[out.has_candidate]
    # one fp32 sigmoid of the same bias (assert_close's fp32 default rtol 1.3e-6 = ~11 ulps of 2^-24 * 0.12)
    torch.testing.assert_close(gates, torch.full_like(gates, torch.sigmoid(torch.tensor(-2.0)).item()))


def test_decouple_lm_gives_the_lm_head_exactly_the_cross_entropy_gradient():
    """decouple_lm: d(loss)/d(lm_ce) is the LM loss weight alone (the baseline's gradient, scaled), the mixture
    value is unchanged, and the copy head and gate still learn from the mixture."""
    hidden, lm_ce, labels, mask, doc = _case(seed=2)
    grads = {}
    for decouple in (False, True):
        head = _head(lm_loss_weight=0.7, decouple_lm=decouple)
        ce = lm_ce.clone().requires_grad_(True)
        out = head(hidden, ce, labels, mask, doc, impl="chunked")
        (out.loss * mask).sum().backward()
        grads[decouple] = (out.mix_nll.detach(), ce.grad, head.q_proj.weight.grad, head.gate.weight.grad)
    (mix_coupled, ce_grad_coupled, *_), (mix, ce_grad, q_grad, gate_grad) = grads[False], grads[True]
    torch.testing.assert_close(mix, mix_coupled, rtol=0, atol=0)  # same forward value
    # exactly w * dCE/dlogits downstream (no mixture term): one fp32 product, within assert_close's fp32 default
    torch.testing.assert_close(ce_grad, 0.7 * mask)
    # the coupled mixture does feed back into the LM head: O(1) differences, far outside allclose's 1e-5 rtol
    assert not torch.allclose(ce_grad_coupled, ce_grad)
    assert q_grad.abs().sum() > 0 and gate_grad.abs().sum() > 0


def test_decouple_lm_needs_an_lm_loss_weight():
    from cplm_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="lm_loss_weight > 0"):
        CopyHeadConfig(decouple_lm=True).validate()


def _two_documents(seed: int, n: int = 20):
    """A packed row of two documents as the loader gives it (tokens d0 EOD d1 ...), the second repeating the
    first: without document ids, every position of the second document would find its label in the first.

    Segment ids: the EOD closes document 0 (its label, the next document's first token, must never be
    proposed to document 1), document 1 starts right after it."""
    g = torch.Generator().manual_seed(seed)
    eod = 0
    first = torch.randint(1, 6, (n,), generator=g)
    stream = torch.cat([first, torch.tensor([eod]), first, torch.tensor([eod])])
    tokens, labels = stream[:-1], stream[1:]
    doc = torch.zeros_like(tokens)
    doc[n + 1:] = 1  # the token after the EOD starts document 1
    hidden_doc = torch.randn(n + 1, HID, generator=g)
    hidden = torch.cat([hidden_doc, hidden_doc[:n]])  # document 1 looks exactly like document 0
    return hidden[None], labels[None], doc[None], n


@pytest.mark.parametrize("impl", ["naive", "chunked", "fused"])
def test_candidates_never_come_from_an_earlier_document(impl):
    """Changing document 0's hidden states and labels leaves loss and gate of document 1 bit-identical when
    document ids reach the head; without them the change shows (document 1 copies from document 0)."""
    torch.manual_seed(0)
    head = CopyPasteHead(HID, CopyHeadConfig(heads=2, head_dim=32, block_size=7), init_std=0.5)
    hidden, labels, doc, n = _two_documents(seed=3)
    lm_ce = torch.full(labels.shape, 3.0)
    changed_hidden, changed_labels = hidden.clone(), labels.clone()
    changed_hidden[:, :n + 1] = torch.randn(1, n + 1, HID)
    changed_labels[:, :n] = torch.randint(6, 12, (1, n))  # document 0's labels, not its EOD's
    second = slice(n + 1, None)
    with torch.no_grad():
        base = head(hidden, lm_ce, labels, None, doc, impl=impl)
        changed = head(changed_hidden, lm_ce, changed_labels, None, doc, impl=impl)
        no_docs = head(hidden, lm_ce, labels, None, None, impl=impl)
        no_docs_changed = head(changed_hidden, lm_ce, changed_labels, None, None, impl=impl)
    # bitwise: document 0's entries are masked to -inf for document 1, so they add exact zeros to the same sums
    assert torch.equal(changed.loss[:, second], base.loss[:, second])
    assert torch.equal(changed.gate[:, second], base.gate[:, second])
    assert base.gate[0, n + 1] == 0 and not base.has_candidate[0, n + 1]  # document 1's first position
    assert base.has_match[:, second][:, 1:].any()  # document 1 copies from its own earlier positions
    assert not torch.equal(no_docs_changed.loss[:, second], no_docs.loss[:, second])
    assert no_docs.has_candidate[0, n + 1]  # the EOD (label: document 1's first token) and all of doc 0


def test_fused_head_dim_is_checked_where_the_head_is_built():
    """The kernel's head dims are the machine's business: the config loads (no torch, no kernels), the head's
    implementation refuses them when it resolves to the fused kernel (the trainer resolves it before any process
    group; TRITON_INTERPRET=1 makes the kernel available on this CPU)."""
    from cplm_megatron.errors import ConfigError
    from cplm_megatron.model.copy_head import resolve_impl

    for impl in ("fused", "auto", "chunked"):
        CopyHeadConfig(head_dim=48, impl=impl).validate()
    with pytest.raises(ConfigError, match=r"copy_head.head_dim=48: the fused copy kernel \(copy_head.impl=fused\) "
                                          r"supports head_dim 32/64/128; .* copy_head.impl=chunked"):
        resolve_impl(CopyHeadConfig(head_dim=48, impl="fused"), torch.device("cpu"))
    assert resolve_impl(CopyHeadConfig(head_dim=48, impl="auto"), torch.device("cpu")) == "chunked"
    assert resolve_impl(CopyHeadConfig(head_dim=48, impl="chunked"), torch.device("cuda")) == "chunked"
    with pytest.raises(ConfigError, match="impl=auto picks it on this CUDA machine"):
        resolve_impl(CopyHeadConfig(head_dim=48, impl="auto"), torch.device("cuda"))  # no tensor: no GPU needed
    assert resolve_impl(CopyHeadConfig(head_dim=64, impl="auto"), torch.device("cuda")) == "fused"


def test_fp8_that_cannot_apply_is_stated_in_the_log(caplog):
    head = CopyPasteHead(HID, CopyHeadConfig(heads=2, head_dim=32, fp8=True))
    with caplog.at_level("WARNING", logger="cplm_megatron.model.copy_head"):
        impl = head.impl_for(torch.device("cpu"))
        head.impl_for(torch.device("cpu"))  # once per device type
    assert impl == "chunked"
    assert [r.getMessage() for r in caplog.records] == [
        "copy_head.fp8=true is not applied: copy_head.impl=auto runs the chunked path on cpu, and FP8 copy "
        "scores exist only in the fused kernel (CUDA + triton)"]
