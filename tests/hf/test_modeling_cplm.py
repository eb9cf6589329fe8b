"""CPLMForCausalLM numerics vs an independent naive reference (plain Llama backbone + loop copy head)."""

import math

import pytest
import torch
from hf_testing import (
    BACKBONE,
    BOS_EOS_ID,
    PAD_ID,
    QWEN3,
    VOCAB_SIZE,
    cplm_config,
    llama_config_like,
    randomize_norms,
    repetitive_ids,
    tiny_cplm,
)
from transformers import LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.hf.modeling_cplm import CPLMForCausalLM

# on log-probabilities: fp32 model vs fp32 plain-Llama backbone + float64 naive copy head; the difference is the
# fp32 rounding of the copy head and mixture (|log p| <~ 7; sums over <= 20 positions and 300 vocab entries):
# random-walk ~sqrt(300) * 2^-24 * 7 ~ 2e-6 -> 1e-5
ATOL = 1e-5


def naive_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean() + eps) * weight


def reference_log_probs(
    model: CPLMForCausalLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    eod: int | None = None,
) -> torch.Tensor:
    """log p of the mixture: a plain fp32 LlamaForCausalLM for h and p_LM, float64 loops for the copy head.

    With `eod`, a candidate j must be in t's document: no real `eod` token among positions j .. t-1."""
    config = model.config
    plain = LlamaForCausalLM(llama_config_like(config))
    backbone = {k: v for k, v in model.state_dict().items() if not k.startswith("copy_head.")}
    plain.load_state_dict(backbone, strict=True)
    plain.eval()
    head = {k.removeprefix("copy_head."): v.double() for k, v in model.state_dict().items() if k.startswith("copy_head.")}
    with torch.no_grad():
        logits = plain(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        p_lm = torch.softmax(logits.double(), dim=-1)
        # h_t: the final-normed hidden states that feed lm_head
        hidden = plain.model(input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
        hidden = hidden.double()
    batch, length = input_ids.shape
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    heads, width = config.copy_heads, config.copy_head_dim

    def project(weight: torch.Tensor, norm: str, h: torch.Tensor, c: int) -> torch.Tensor:
        vector = weight[c * width:(c + 1) * width] @ h
        return naive_rms_norm(vector, head[norm], config.copy_norm_eps) if config.copy_qk_norm else vector

    out = torch.empty(batch, length, VOCAB_SIZE, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            candidates = [j for j in range(t) if valid[b, j] and valid[b, j + 1]
                          and not any(input_ids[b, i] == eod and valid[b, i] for i in range(j, t))]
            if not candidates:
                out[b, t] = p_lm[b, t].log()
                continue
            p_copy = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
            for c in range(heads):
                query = project(head["q_proj.weight"], "q_norm.weight", hidden[b, t], c)
                scores = torch.stack(
                    [query @ project(head["k_proj.weight"], "k_norm.weight", hidden[b, j], c) for j in candidates]
                ) / math.sqrt(width)
                for j, weight in zip(candidates, torch.softmax(scores, dim=0)):
                    p_copy[input_ids[b, j + 1]] += weight / heads
            gate = torch.sigmoid(head["gate.weight"][0] @ hidden[b, t] + head["gate.bias"][0])
            out[b, t] = ((1 - gate) * p_lm[b, t] + gate * p_copy).log()
    return out


def left_padded(ids: torch.Tensor, real_lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-pad row i to keep only its last real_lengths[i] tokens; returns ids, mask, position ids."""
    mask = torch.zeros_like(ids)
    for row, real in enumerate(real_lengths):
        mask[row, ids.shape[1] - real:] = 1
    padded = torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID))
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return padded, mask, positions


def right_padded(ids: torch.Tensor, real_lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.zeros_like(ids)
    for row, real in enumerate(real_lengths):
        mask[row, :real] = 1
    return torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID)), mask


@pytest.mark.parametrize(
    "qk_norm, tied, padding",
    [(False, False, None), (True, True, "right"), (True, False, "left"), (False, True, "left"), (True, False, "hole")],
)
def test_log_probs_match_naive_reference(qk_norm: bool, tied: bool, padding: str | None) -> None:
    model = tiny_cplm(cplm_config(copy_qk_norm=qk_norm, tie_word_embeddings=tied), seed=1)
    ids = repetitive_ids(3, 20, seed=2)
    mask = positions = None
    if padding == "right":
        ids, mask = right_padded(ids, [20, 13, 4])
    elif padding == "left":
        ids, mask, positions = left_padded(ids, [20, 11, 3])
    elif padding == "hole":  # a masked-out token mid-sequence: j before it proposes no label
        mask = torch.ones_like(ids)
        mask[1, 8] = 0
    with torch.no_grad():
        got = model(ids, attention_mask=mask, position_ids=positions).logits
    expected = reference_log_probs(model, ids, mask, positions)
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    assert got.dtype == torch.float32 and got.shape == (3, 20, VOCAB_SIZE)
    torch.testing.assert_close(got[real], expected[real].float(), atol=ATOL, rtol=0)
    # The copy head must actually move the distribution, or this comparison proves little.
    lm_only = torch.log_softmax(model.lm_head(model.model(ids, attention_mask=mask, position_ids=positions)
                                              .last_hidden_state), dim=-1)
    assert (got - lm_only).abs()[real].max() > 0.1


def test_distribution_sums_to_one_and_gate_is_zero_without_candidates() -> None:
    model = tiny_cplm(cplm_config(), gate_bias=3.0)  # g ~ 0.95 wherever a candidate exists
    ids, mask, positions = left_padded(repetitive_ids(2, 12, seed=3), [12, 5])
    with torch.no_grad():
        log_probs = model(ids, attention_mask=mask, position_ids=positions).logits
        lm_log_probs = torch.log_softmax(
            model.lm_head(model.model(ids, attention_mask=mask, position_ids=positions).last_hidden_state).float(), -1
        )
    real = mask.bool()
    # a sum of 300 fp32 probabilities: random-walk rounding sqrt(300) * 2^-24 ~ 1e-6 (+ exp of |log p| <~ 7) -> 1e-5
    torch.testing.assert_close(log_probs.exp().sum(-1)[real], torch.ones(int(real.sum())), atol=1e-5, rtol=0)
    # No candidate at t=0, nor at the first real token of the left-padded row: exactly the LM distribution.
    # bitwise: without candidates the head returns the LM log-probs themselves
    assert torch.equal(log_probs[0, 0], lm_log_probs[0, 0])
    assert torch.equal(log_probs[1, 7], lm_log_probs[1, 7])
    # the copy head moves log-probs by O(1) where it has candidates: 0.1 is far outside rounding
    assert not torch.allclose(log_probs[0, 1:], lm_log_probs[0, 1:], atol=0.1)


def test_loss_is_mean_mixture_nll_of_shifted_labels() -> None:
    model = tiny_cplm(cplm_config(), seed=4)
    ids = repetitive_ids(2, 10, seed=5)
    labels = ids.clone()
    labels[0, 3] = -100
    labels[1, 7:] = -100
    out = model(ids, labels=labels)
    expected_log_probs = reference_log_probs(model, ids)
    targets = labels[:, 1:]
    keep = targets != -100
    picked = expected_log_probs[:, :-1].gather(-1, targets.clamp_min(0)[..., None]).squeeze(-1)
    expected = -(picked[keep]).mean()
    torch.testing.assert_close(out.loss.double(), expected, atol=ATOL, rtol=0)


def test_backward_is_finite_with_padding_and_saturated_gate() -> None:
    model = tiny_cplm(cplm_config(copy_qk_norm=True), gate_bias=40.0)  # sigmoid(40) == 1.0 in fp32
    ids, mask = right_padded(repetitive_ids(2, 12, seed=6), [12, 6])
    labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
    out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, param in model.named_parameters():
        assert param.grad is None or torch.isfinite(param.grad).all(), name
    assert model.copy_head.q_proj.weight.grad.abs().sum() > 0


def test_causal_later_tokens_do_not_change_earlier_log_probs() -> None:
    model = tiny_cplm(cplm_config(copy_qk_norm=True), seed=7)
    ids = repetitive_ids(2, 16, seed=8)
    changed = ids.clone()
    changed[:, 9:] = torch.randint(0, VOCAB_SIZE, (2, 7), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        before = model(ids).logits
        after = model(changed).logits
    # bitwise: causal masks make the later positions add exact zeros to the earlier rows' sums
    assert torch.equal(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])


def test_logits_to_keep_returns_the_last_positions() -> None:
    model = tiny_cplm(cplm_config(), seed=10)
    ids = repetitive_ids(2, 11, seed=11)
    with torch.no_grad():
        full = model(ids).logits
        last = model(ids, logits_to_keep=3).logits
        picked = model(ids, logits_to_keep=torch.tensor([0, 4, 10])).logits
    # the same rows of the same forward; the LM head matmul over 3 rows vs all rows may block differently: a few
    # roundings of |log p| <~ 7 (7 * 2^-24 ~ 4e-7 each) -> 1e-6
    torch.testing.assert_close(last, full[:, -3:], atol=1e-6, rtol=0)
    torch.testing.assert_close(picked, full[:, [0, 4, 10]], atol=1e-6, rtol=0)


def test_parameter_names_shapes_and_init() -> None:
    config = cplm_config(copy_qk_norm=True)
    model = CPLMForCausalLM(config)
    width = config.copy_heads * config.copy_head_dim
    head_params = {name: tuple(p.shape) for name, p in model.named_parameters() if name.startswith("copy_head.")}
    assert head_params == {
        "copy_head.q_proj.weight": (width, 64),
        "copy_head.k_proj.weight": (width, 64),
        "copy_head.q_norm.weight": (config.copy_head_dim,),
        "copy_head.k_norm.weight": (config.copy_head_dim,),
        "copy_head.gate.weight": (1, 64),
        "copy_head.gate.bias": (1,),
    }
    assert model.copy_head.gate.bias.item() == -2.0
    # set by the initializer, not computed
    assert torch.equal(model.copy_head.q_norm.weight, torch.ones(config.copy_head_dim))
    no_norm = CPLMForCausalLM(cplm_config(copy_gate_bias_init=-3.5))
    assert not any("norm" in name for name, _ in no_norm.copy_head.named_parameters())
    assert no_norm.copy_head.gate.bias.item() == -3.5


def test_qwen3_backbone_is_transformers_qwen3_decoder() -> None:
    """cplm_backbone=qwen3: the decoder is transformers' Qwen3Model built from the CPLM config (qk-norm, head_dim 24,
    RoPE base 1e6, Qwen3's derived layer_types); with the same weights its LM logits are Qwen3ForCausalLM's, bitwise
    (the same modules on the same inputs)."""
    model = tiny_cplm(cplm_config(**QWEN3), seed=4)
    randomize_norms(model, seed=4)
    assert type(model.model).__name__ == "Qwen3Model" and model.config.layer_types == ["full_attention"] * 2
    plain = Qwen3ForCausalLM(Qwen3Config(**BACKBONE, **{k: v for k, v in QWEN3.items() if k != "cplm_backbone"}))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("copy_head.")})
    ids = repetitive_ids(2, 9, seed=3)
    with torch.no_grad():
        assert torch.equal(model.lm_head(model.model(ids).last_hidden_state), plain.eval()(ids).logits)
    with pytest.raises(ValueError, match="cplm_backbone='nope' is not a model type transformers knows"):
        cplm_config(cplm_backbone="nope")


@pytest.mark.parametrize(
    "field, value", [("copy_heads", 0), ("copy_head_dim", -1), ("copy_norm_eps", 0.0), ("copy_heads", 2.5),
                     ("copy_mixing", ""), ("copy_eod_token_id", -1)]
)
def test_config_rejects_bad_copy_fields(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CPLMConfig(**{field: value})


def test_bad_inputs_raise_clear_errors() -> None:
    model = tiny_cplm(cplm_config())
    ids = repetitive_ids(1, 6)
    with pytest.raises(ValueError, match="needs input_ids"):
        model(inputs_embeds=torch.zeros(1, 6, 64))
    with pytest.raises(ValueError, match="2-D padding attention_mask"):
        model(ids, attention_mask=torch.ones(1, 1, 6, 6))
    with pytest.raises(ValueError, match="logits_to_keep=0"):
        model(ids, labels=ids, logits_to_keep=1)
    with pytest.raises(ValueError, match="unknown copy-head mixing 'nope'; choose one of"):
        CPLMForCausalLM(cplm_config(copy_mixing="nope"))


def prompt_with_documents(batch: int, length: int, seed: int) -> torch.Tensor:
    """Repetitive prompts in which every row holds EOD tokens (the second document repeats the first's ids)."""
    ids = repetitive_ids(batch, length, seed=seed)
    ids[:, length // 2:] = ids[:, : length - length // 2]
    ids[:, length // 2 - 1] = BOS_EOS_ID
    ids[0, 3] = BOS_EOS_ID  # row 0: a short first document too
    return ids


@pytest.mark.parametrize("padding", [None, "left"])
def test_copy_candidates_reset_at_eod(padding: str | None) -> None:
    """A prompt with EOD: candidates stay in their document (the reference with documents), the gate is 0 at
    each document's first position; `copy_reset_at_eod=False` copies across (so the difference is visible)."""
    model = tiny_cplm(cplm_config(copy_qk_norm=True), seed=12)
    assert (model.config.copy_eod_token_id, model.config.copy_reset_at_eod) == (BOS_EOS_ID, True)
    ids = prompt_with_documents(2, 18, seed=13)
    mask = positions = None
    if padding == "left":
        ids, mask, positions = left_padded(ids, [18, 12])
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    with torch.no_grad():
        got = model(ids, attention_mask=mask, position_ids=positions).logits
        hidden = model.model(ids, attention_mask=mask, position_ids=positions).last_hidden_state
        lm_only = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)
    torch.testing.assert_close(got[real], reference_log_probs(model, ids, mask, positions, eod=BOS_EOS_ID)[real]
                               .float(), atol=ATOL, rtol=0)
    after_eod = torch.zeros_like(real)
    after_eod[:, 1:] = (ids[:, :-1] == BOS_EOS_ID) & real[:, :-1]
    # bitwise: right after an EOD there is no candidate, so the head returns the LM log-probs themselves
    assert after_eod.sum() >= 3 and torch.equal(got[after_eod], lm_only[after_eod])
    across = tiny_cplm(cplm_config(copy_qk_norm=True, copy_reset_at_eod=False), seed=12)
    with torch.no_grad():
        crossing = across(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(crossing[real], reference_log_probs(across, ids, mask, positions)[real].float(),
                               atol=ATOL, rtol=0)
    assert (crossing - got).abs()[real].max() > 0.1


def test_cached_forward_over_an_eod_equals_the_uncached_forward() -> None:
    """The EOD arrives in a later cached call (and earlier in the cache): documents are counted over all
    cached and new token ids."""
    from transformers import DynamicCache

    model = tiny_cplm(cplm_config(), seed=14)
    ids = prompt_with_documents(2, 20, seed=15)
    with torch.no_grad():
        full = model(ids).logits
        cache = DynamicCache()
        parts = [model(ids[:, :2], past_key_values=cache, use_cache=True).logits,  # row 0's EOD at 3: later
                 model(ids[:, 2:12], past_key_values=cache, use_cache=True).logits,
                 model(ids[:, 12:], past_key_values=cache, use_cache=True).logits]
    # fp32 attention over a cache vs over the whole prompt: rounding only (~1e-6), as in test_cplm_generation
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)
