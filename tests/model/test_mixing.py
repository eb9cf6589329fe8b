"""One mixing rule for training, the vocab-parallel full distribution and the HF export.

A variant registered once in `cplm_megatron.model.mixing.MIXING_RULES` must change all three. The test
variant `half` fixes g = 1/2: each consumer built with it must equal the same consumer under the default
`gate` rule with the gate's parameters zeroed (sigmoid(0) = 1/2), and differ from `gate` with its own
random parameters.
"""
import pytest
import torch

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
    return "half"


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
