"""The gradient task: the projection figure against a least-squares reference, and the per-head split
of dL/dh against the full model's own backward pass."""
from __future__ import annotations

import pytest
import torch

from cplm_megatron.data.synthetic import copy_sample, make_batch
from cplm_megatron.evaluation.tasks.gradient import (
    gradient_figures,
    hf_head_gradients,
    megatron_head_gradients,
    outside_span_fraction,
)
from tests.evaluation.runs import VOCAB

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def test_outside_span_fraction_against_least_squares():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 5, generator=g, dtype=torch.float64)
    inside = torch.randn(7, 5, generator=g, dtype=torch.float64) @ w.T  # rows in span(W)
    # fp64 projections of 7 x 50 matrices onto a 5-dim span: ~50 * 2^-53 ~ 6e-15 times a condition number O(10);
    # 1e-12 leaves room and catches any wrong projection
    assert outside_span_fraction(inside, w) == pytest.approx(0.0, abs=1e-12)
    x = torch.randn(7, 50, generator=g, dtype=torch.float64)
    coef = torch.linalg.lstsq(w, x.T).solution  # least-squares projection onto span(W), independent of QR
    residual = x.T - w @ coef
    assert outside_span_fraction(residual.T, w) == pytest.approx(1.0, abs=1e-12)
    expected = float(torch.linalg.norm(residual) / torch.linalg.norm(x))
    assert outside_span_fraction(x, w) == pytest.approx(expected, rel=1e-12)


def copy_batch() -> dict:
    return make_batch([copy_sample(i, 64, VOCAB, seed=5)[0] for i in range(3)])


def full_model_hidden_grad(scorer, batch) -> tuple[float, torch.Tensor]:
    """(loss, dL/dh [b*s, d]) from one backward pass through the whole model (reference)."""
    model = scorer.model
    captured = []

    def keep(_module, _args, output):
        output.retain_grad()
        captured.append(output)

    handle = model.decoder.register_forward_hook(keep)
    try:
        inputs = scorer.model_inputs(batch)
        per_token = model(**inputs, output="loss")
        mask = inputs["loss_mask"]
        loss = (per_token * mask).sum() / mask.sum()
        loss.backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    grad = captured[0].grad  # [s, b, d]
    return float(loss), grad.transpose(0, 1).reshape(-1, grad.shape[-1])


@pytest.mark.parametrize("name", ["baseline", "cplm"])
def test_head_split_sums_to_the_models_hidden_gradient(megatron, name):
    scorer = megatron[name]
    batch = copy_batch()
    grads = megatron_head_gradients(scorer, batch)
    loss, reference = full_model_hidden_grad(scorer, batch)
    # the same fp32 forward reached through two code paths (head split vs full model): a few roundings of the
    # mean over 192 tokens (~2^-24 each)
    assert grads.loss == pytest.approx(loss, rel=1e-6)
    total = grads.hidden_grad_lm + (grads.hidden_grad_copy if grads.hidden_grad_copy is not None else 0)
    # the split recomputes dL/dh in fp32 from the same logits: 512-term vocab sums, ~sqrt(512) * 2^-24 ~ 1.3e-6
    # relative -> 1e-5; atol 1e-9 for entries near zero (per-token gradients are ~1e-3 after the 192-token mean)
    torch.testing.assert_close(total, reference, rtol=1e-5, atol=1e-9)
    # the LM path is exactly G W (the backward of logits = h W^T)
    # the same 512-term product by autograd and explicitly: ~sqrt(512) * 2^-24 relative -> 1e-5
    torch.testing.assert_close(grads.hidden_grad_lm, grads.logit_grad @ grads.lm_weight, rtol=1e-5, atol=1e-10)
    assert grads.logit_grad.shape == (3 * 64, VOCAB) and grads.lm_weight.shape == (VOCAB, 64)
    figures = gradient_figures(grads)
    assert 0.9 < figures["logit_grad_outside_span"] < 1.0  # d=64 of V=512 dimensions
    # fp64 arithmetic on the same figure: pytest.approx's default rel 1e-6 is far above its rounding
    assert figures["logit_grad_inside_span"] == pytest.approx((1 - figures["logit_grad_outside_span"] ** 2) ** 0.5)
    if name == "baseline":
        assert grads.hidden_grad_copy is None and figures["copy_grad_share"] == 0.0
    else:
        assert 0.0 < figures["copy_grad_share"] < 1.0


@pytest.mark.parametrize("name", ["baseline", "cplm"])
def test_hf_gradients_match_megatron(megatron, hf, name):
    batch = copy_batch()
    got, want = hf_head_gradients(hf[name], batch), megatron_head_gradients(megatron[name], batch)
    # two independent fp32 implementations (HF vs Megatron, see BACKEND_ATOL in test_scorers.py): ~1e-5 relative on
    # the loss; the gradients (softmax minus one-hot: differences of probabilities near 0 and 1) magnify relative
    # error on small entries -> rtol 1e-3, atol 1e-8 for entries near zero
    assert got.loss == pytest.approx(want.loss, rel=1e-5)
    torch.testing.assert_close(got.logit_grad, want.logit_grad, rtol=1e-3, atol=1e-8)
    torch.testing.assert_close(got.hidden_grad_lm, want.hidden_grad_lm, rtol=1e-3, atol=1e-8)
    if name == "cplm":
        torch.testing.assert_close(got.hidden_grad_copy, want.hidden_grad_copy, rtol=1e-3, atol=1e-8)


def test_projection_is_chunked_and_the_chance_value_is_reported(monkeypatch):
    """Row chunks give the same figure as one block (so no fp64 [N, V] matrix is needed at V = 131072), and a
    gradient unrelated to W keeps d/V of its energy: outside ~ sqrt(1 - d/V), retained_over_chance ~ 1."""
    from cplm_megatron.evaluation.tasks import gradient

    g = torch.Generator().manual_seed(1)
    w = torch.randn(2048, 32, generator=g)
    grad = torch.randn(300, 2048, generator=g)
    whole = outside_span_fraction(grad, w)
    assert gradient.CHUNK_ELEMENTS // 131072 >= 32  # >= 32 rows of a V = 131072 gradient per 64 MB chunk
    monkeypatch.setattr(gradient, "CHUNK_ELEMENTS", 7 * 2048)  # 7 rows per chunk, a ragged last chunk
    # fp64 sums of the same squared entries in another grouping: ~1e-15 relative
    assert outside_span_fraction(grad, w) == pytest.approx(whole, rel=1e-12)
    grads = gradient.HeadGradients(0.0, grad, w, torch.randn(4, 32, generator=g), None)
    figures = gradient_figures(grads)
    assert figures["logit_grad_outside_span_chance"] == pytest.approx((1 - 32 / 2048) ** 0.5, rel=1e-12)
    # a random [300, 2048] G: its retained energy is a chi-square mean over 300 * 32 dof -> ~2% spread
    assert figures["retained_over_chance"] == pytest.approx(1.0, abs=0.1)
    assert figures["copy_grad_projection"] == 0.0 and figures["lm_grad_projection"] == pytest.approx(1.0)


@pytest.mark.parametrize("mixing", ["gate", "sentinel"])
def test_hf_split_sums_to_the_hf_models_own_gradient(mixing):
    """HF exports of every mixing rule (sentinel has no single gate logit): g_lm + g_copy = dL/dh of the HF model's
    own loss, and the cosine split's two shares sum to 1."""
    from cplm_megatron.evaluation.scorers import HFScorer
    from tests.hf.hf_testing import cplm_config, tiny_cplm

    model = tiny_cplm(cplm_config(copy_mixing=mixing), seed=2, gate_bias=0.5)
    scorer = HFScorer(model, None)
    batch = make_batch([copy_sample(i, 32, 300, seed=5)[0] for i in range(2)])
    got = hf_head_gradients(scorer, batch)
    captured = []
    handle = model.model.register_forward_hook(lambda _m, _a, out: captured.append(out.last_hidden_state))
    try:
        total, grads = 0.0, []
        for row in range(2):
            captured.clear()
            out = model(input_ids=batch["tokens"][row:row + 1])
            hidden = captured[0]
            hidden.retain_grad()
            nll = -out.logits[0].gather(-1, batch["labels"][row][:, None]).squeeze(-1)
            loss = nll.sum() / batch["loss_mask"].sum()
            loss.backward()
            total += float(loss)
            grads.append(hidden.grad[0])
    finally:
        handle.remove()
    # the same fp32 computation split at h vs whole (one backward): reassociated sums of ~V terms, 1e-5 relative
    assert got.loss == pytest.approx(total, rel=1e-5)
    torch.testing.assert_close(got.hidden_grad_lm + got.hidden_grad_copy, torch.cat(grads), rtol=1e-4, atol=1e-8)
    figures = gradient_figures(got)
    assert figures["copy_grad_projection"] + figures["lm_grad_projection"] == pytest.approx(1.0, abs=1e-9)
    assert -1.0 <= figures["copy_lm_grad_cosine"] <= 1.0


def test_task_in_sequence_chunks_equals_the_whole_batch(megatron, monkeypatch):
    """The task runs its batch one sequence at a time (bounded memory at V = 131072) with the whole batch's loss
    normalization: the same figures as the whole batch at once."""
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.tasks import gradient

    scorer = megatron["cplm"]
    options = EvalOptions(limit=3, copy_length=64, show_progress=False)
    whole = gradient_figures(gradient.head_gradients(scorer, gradient.gradient_batch(scorer, options)))
    monkeypatch.setattr(gradient, "LOGIT_ELEMENTS", 1)  # one sequence per chunk
    result = gradient.run(scorer, options)
    assert result.details["sequences_per_chunk"] == 1 and result.details["sequences"] == 3
    # the same fp32 per-sequence computations at another batch size (matmul blocking): ~1e-6 relative; sums of
    # squares in fp64 -> 1e-5 leaves room
    for key, value in whole.items():
        if value == value:  # not nan
            assert result.metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
