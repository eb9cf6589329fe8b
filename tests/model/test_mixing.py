"""One mixing rule for training, the vocab-parallel full distribution and the HF export.

A variant registered once in `cplm_megatron.model.mixing.MIXING_RULES` must change all three. The test
variant `half` fixes g = 1/2: each consumer built with it must equal the same consumer under the default
`gate` rule with the gate's parameters zeroed (sigmoid(0) = 1/2), and differ from `gate` with its own
random parameters.
"""
import pytest
import torch

from cplm_megatron.model import config as model_config
from cplm_megatron.model import mixing
from cplm_megatron.model.copy_head import CopyHeadConfig, CopyPasteHead

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

HID, VOCAB = 32, 12
# fp32 log-probs of two computations that differ only in how g = 1/2 is reached (sigmoid(0) vs a zero logit)
ATOL = 1e-6


@pytest.fixture
def half(monkeypatch: pytest.MonkeyPatch) -> str:
    def zero_logit(hidden, weight, bias):
        return hidden.new_zeros(hidden.shape[:-1])

    monkeypatch.setitem(mixing.MIXING_RULES, "half", mixing.MixingRule(zero_logit, uses_gate_weight=False))
    monkeypatch.setattr(model_config, "MIXING_VARIANTS", (*model_config.MIXING_VARIANTS, "half"))
    return "half"


def test_the_config_knows_every_registered_rule() -> None:
    """The config checks copy_head.mixing against names it holds without torch: the same as the rules."""
    assert sorted(model_config.MIXING_VARIANTS) == sorted(mixing.MIXING_RULES)


def _inputs(seed: int = 0, b: int = 2, s: int = 24):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, s, HID, generator=g)
    labels = torch.randint(0, VOCAB, (b, s), generator=g)
    lm_logits = torch.randn(b, s, VOCAB, generator=g)
    return hidden, labels, lm_logits


def _head(rule: str, zero_gate: bool = False) -> CopyPasteHead:
    torch.manual_seed(0)
    head = CopyPasteHead(HID, CopyHeadConfig(heads=2, head_dim=8, mixing=rule, block_size=5), init_std=0.5)
    with torch.no_grad():
        head.gate.weight.copy_(torch.randn(1, HID) * (0.0 if zero_gate else 0.5))
        head.gate.bias.fill_(0.0 if zero_gate else 1.5)
    return head


def test_a_registered_variant_is_accepted_by_the_config(half: str) -> None:
    CopyHeadConfig(mixing=half).validate()
    from cplm_megatron.errors import ConfigError

    with pytest.raises(ConfigError, match="copy_head.mixing='nope' is not one of"):
        CopyHeadConfig(mixing="nope").validate()


def test_a_new_variant_changes_the_training_loss(half: str) -> None:
    hidden, labels, lm_logits = _inputs()
    lm_ce = torch.nn.functional.cross_entropy(lm_logits.transpose(1, 2), labels, reduction="none")
    with torch.no_grad():
        got = _head(half)(hidden, lm_ce, labels, impl="chunked")
        same = _head("gate", zero_gate=True)(hidden, lm_ce, labels, impl="chunked")
        gated = _head("gate")(hidden, lm_ce, labels, impl="chunked")
    assert (got.gate[got.has_candidate] == 0.5).all() and (got.gate[~got.has_candidate] == 0).all()
    torch.testing.assert_close(got.loss, same.loss, atol=ATOL, rtol=0)
    assert (got.loss - gated.loss).abs().max() > 0.05


def test_a_new_variant_changes_the_vocab_parallel_distribution(half: str) -> None:
    """CopyPasteHead.mixture_log_probs is what CPLMGPTModel calls on every TP rank's vocab slice."""
    hidden, labels, lm_logits = _inputs(seed=1)
    lm_log_probs = torch.log_softmax(lm_logits, dim=-1)

    def sharded(head: CopyPasteHead) -> torch.Tensor:  # two "TP ranks", V/2 columns each
        with torch.no_grad():
            return torch.cat([head.mixture_log_probs(hidden, lm_log_probs[..., v0:v0 + VOCAB // 2], labels, v0)
                              for v0 in (0, VOCAB // 2)], dim=-1)

    got, same, gated = sharded(_head(half)), sharded(_head("gate", zero_gate=True)), sharded(_head("gate"))
    # a sum of 12 fp32 probabilities, each exp of a log-prob with |log p| <~ 10 (absolute rounding 10 * 2^-24
    # per term): <= 12 * (10 + 1) * 2^-24 ~ 8e-6 -> 1e-5
    torch.testing.assert_close(got.exp().sum(-1), torch.ones(got.shape[:2]), atol=1e-5, rtol=0)
    torch.testing.assert_close(got, same, atol=ATOL, rtol=0)
    assert (got - gated).abs().max() > 0.05


def _hf_model(rule: str, zero_gate: bool = False):
    from cplm_megatron.hf.configuration_cplm import CPLMConfig
    from cplm_megatron.hf.modeling_cplm import CPLMForCausalLM

    config = CPLMConfig(vocab_size=VOCAB, hidden_size=HID, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, copy_heads=2, copy_head_dim=8,
                        copy_mixing=rule)
    torch.manual_seed(0)
    model = CPLMForCausalLM(config).eval()
    with torch.no_grad():
        for proj in (model.copy_head.q_proj, model.copy_head.k_proj):
            proj.weight.normal_(0.0, 0.5)
        model.copy_head.gate.weight.copy_(torch.randn(1, HID) * (0.0 if zero_gate else 0.5))
        model.copy_head.gate.bias.fill_(0.0 if zero_gate else 1.5)
    return model


def test_a_new_variant_changes_the_hf_model(half: str) -> None:
    ids = torch.randint(0, 4, (2, 14), generator=torch.Generator().manual_seed(2))  # frequent copy matches
    with torch.no_grad():
        got, same, gated = (_hf_model(*args)(ids).logits for args in ((half,), ("gate", True), ("gate",)))
    torch.testing.assert_close(got, same, atol=ATOL, rtol=0)
    assert (got - gated).abs().max() > 0.05


def test_constant_rule_ignores_the_gate_weight_and_freezes_it() -> None:
    head = CopyPasteHead(HID, CopyHeadConfig(heads=2, head_dim=8, mixing="constant", gate_bias_init=1.5))
    assert not head.gate.weight.requires_grad and torch.equal(head.gate.weight, torch.zeros(1, HID))  # set, not computed
    hidden, labels, _ = _inputs(seed=3)
    with torch.no_grad():
        head.gate.weight.normal_()  # as a converted checkpoint might hold: still ignored
        out = head(hidden, torch.ones(labels.shape), labels, impl="chunked")
    expected = torch.sigmoid(torch.tensor(1.5)).expand(int(out.has_candidate.sum()))
    # g is exp(logsigmoid(b)) in fp32: within a few ulps of sigmoid(b)
    torch.testing.assert_close(out.gate[out.has_candidate], expected, atol=0, rtol=5e-7)


# --- sentinel: the rule that reads the copy statistics (per-head candidate log-sum-exp) ---------------------

def _sentinel_head(dtype: torch.dtype = torch.float32) -> CopyPasteHead:
    torch.manual_seed(0)
    head = CopyPasteHead(HID, CopyHeadConfig(heads=2, head_dim=8, mixing="sentinel", block_size=5), init_std=0.5)
    with torch.no_grad():
        head.gate.weight.normal_(0.0, 0.3)
        head.gate.bias.copy_(torch.tensor([0.5, 2.0]))
    return head.to(dtype)


def test_sentinel_has_one_sentinel_per_copy_head_and_reads_the_copy_statistics() -> None:
    rule = mixing.mixing_rule("sentinel")
    assert rule.uses_copy_stats and rule.gate_rows(3) == 3 and mixing.mixing_rule("gate").gate_rows(3) == 1
    head = _sentinel_head()
    assert head.gate.weight.shape == (2, HID) and head.gate.bias.shape == (2,)
    hidden = torch.randn(4, HID)
    with pytest.raises(ValueError, match="reads the copy statistics"):
        rule.weights(hidden, head.gate.weight, head.gate.bias, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no single gate logit"):
        head.gate_logits(hidden[None])
    # more evidence (a larger candidate lse) opens the gate: g = mean_c sigmoid(lse_c - sigma_c) rises with lse
    lse = torch.tensor([[-1.0, 0.0], [1.0, 2.0], [3.0, 4.0], [-torch.inf, -torch.inf]])
    has = torch.tensor([True, True, True, False])
    w = rule.weights(hidden[:1].expand(4, -1), head.gate.weight, head.gate.bias, has, mixing.CopyStats(lse))
    g = w.gate
    assert g[0] < g[1] < g[2] and g[3] == 0 and w.log_lm[3] == 0
    sigma = head.gate(hidden[:1])[0].detach()
    # fp32 log-sum-exp of two log-sigmoids vs the direct mean of sigmoids: a few ulps
    torch.testing.assert_close(g[:3], torch.sigmoid(lse[:3] - sigma).mean(-1), atol=0, rtol=1e-6)
    torch.testing.assert_close(w.log_lm[:3].exp(), 1 - g[:3], atol=1e-6, rtol=0)


def test_sentinel_vocab_parallel_distribution_sums_to_one_and_matches_the_training_loss() -> None:
    head = _sentinel_head()
    hidden, labels, lm_logits = _inputs(seed=4)
    lm_log_probs = torch.log_softmax(lm_logits, dim=-1)
    lm_ce = -lm_log_probs.gather(-1, labels[..., None])[..., 0]
    with torch.no_grad():
        shards = [head.mixture_log_probs(hidden, lm_log_probs[..., v0:v0 + VOCAB // 2], labels, v0)
                  for v0 in (0, VOCAB // 2)]
        full = torch.cat(shards, dim=-1)
        loss = head(hidden, lm_ce, labels, impl="chunked")
    # as in test_a_new_variant_changes_the_vocab_parallel_distribution: 12 fp32 terms -> 1e-5
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(full.shape[:2]), atol=1e-5, rtol=0)
    # the loss path (two lse over candidates) and the distribution path (softmax scattered onto labels) are
    # different fp32 reductions over <= 24 candidates of |log p| <~ 10: ~24 * 10 * 2^-24 ~ 1.4e-5 -> 3e-5
    torch.testing.assert_close(-full.gather(-1, labels[..., None])[..., 0], loss.mix_nll, atol=3e-5, rtol=0)
    assert (loss.gate[loss.has_candidate] > 0).all() and (loss.gate[~loss.has_candidate] == 0).all()


def test_sentinel_hf_head_equals_the_training_head() -> None:
    """The HF model's copy head with the training head's weights gives the same mixture (one shipped rule)."""
    model = _hf_model("sentinel")
    head = _sentinel_head()
    hf_head = model.copy_head
    assert hf_head.gate.weight.shape == (2, HID)
    with torch.no_grad():
        for name in ("q_proj.weight", "k_proj.weight", "gate.weight", "gate.bias"):
            dict(hf_head.named_parameters())[name].copy_(dict(head.named_parameters())[name])
    from cplm_megatron.hf import modeling_cplm as hf

    hidden, labels, lm_logits = _inputs(seed=5, b=1)
    ids = torch.cat([labels[:, :1], labels], dim=1)[:, :-1]  # labels y_t = x_{t+1}
    lm_log_probs = torch.log_softmax(lm_logits, dim=-1)
    with torch.no_grad():
        train = head.mixture_log_probs(hidden, lm_log_probs, hf.candidate_labels(ids), 0)
        n = ids.shape[1]
        log_p_copy, has, lse = hf.copy_log_probs(hf_head.queries(hidden), hf_head.keys(hidden), hf.candidate_labels(ids),
                                                 hf.candidate_mask(torch.ones_like(ids, dtype=torch.bool),
                                                                   torch.arange(n)), VOCAB, return_lse=True)
        got = hf.mixture_log_probs(lm_logits, hf_head.mixture_weights(hidden, has, lse), log_p_copy, has)
    # two fp32 implementations (blocked einsum vs matmul, masks built differently): ~24 * 10 * 2^-24 -> 3e-5
    torch.testing.assert_close(got, train, atol=3e-5, rtol=0)
    assert has.sum() > 0


def test_sentinel_trains_in_bf16() -> None:
    """bf16 parameters and hidden states: the sentinel logits are cast to fp32 before the mixture."""
    head = _sentinel_head(torch.bfloat16)
    hidden, labels, lm_logits = _inputs(seed=6)
    h = hidden.bfloat16().requires_grad_()
    lm_ce = torch.nn.functional.cross_entropy(lm_logits.transpose(1, 2), labels, reduction="none")
    out = head(h, lm_ce, labels, impl="chunked")
    out.loss.sum().backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss).all()
    assert head.gate.weight.grad.abs().sum() > 0 and torch.isfinite(h.grad).all()
    ref = _sentinel_head()(hidden, lm_ce, labels, impl="chunked")
    # bf16 weights and inputs round at 2^-8 relative: the scores (|s| <~ 10) move by ~0.1, log p by about as much
    assert (out.loss.detach() - ref.loss.detach()).abs().max() < 0.3


def test_sentinel_with_the_auxiliary_losses_and_decouple_lm() -> None:
    """The auxiliary terms and decouple_lm act on the sentinel mixture as on the gate's: loss = mix + w_lm CE +
    w_copy copy NLL, and with decouple_lm the LM CE's gradient is its own weight only."""
    torch.manual_seed(0)
    cfg = CopyHeadConfig(heads=2, head_dim=8, mixing="sentinel", block_size=5, lm_loss_weight=1.0,
                         copy_loss_weight=0.5, decouple_lm=True)
    cfg.validate()
    head = CopyPasteHead(HID, cfg, init_std=0.5)
    hidden, labels, lm_logits = _inputs(seed=7)
    lm_ce = torch.nn.functional.cross_entropy(lm_logits.transpose(1, 2), labels, reduction="none").requires_grad_()
    out = head(hidden, lm_ce, labels, impl="chunked")
    copy_nll = torch.where(out.has_match, -out.log_p_copy, 0.0)
    # the same fp32 terms summed in the same order: bitwise
    assert torch.equal(out.loss, out.mix_nll + 1.0 * lm_ce + 0.5 * copy_nll)
    (grad,) = torch.autograd.grad(out.loss.sum(), lm_ce)
    assert torch.equal(grad, torch.ones_like(grad))  # decoupled: d loss / d CE_t = lm_loss_weight exactly
    assert out.has_match.any() and (out.gate[out.has_candidate] > 0).all()
