"""KV-cache generation with CPLMForCausalLM: the cached copy keys must reproduce the uncached forward."""

import pytest
import torch
from hf_testing import BOS_EOS_ID, PAD_ID, STEP_ATOL, cplm_config, llama_config_like, repetitive_ids, tiny_cplm
from transformers import DynamicCache, LlamaForCausalLM

from cplm_megatron.hf.modeling_cplm import COPY_STATE_ATTR, CPLMForCausalLM

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model() -> CPLMForCausalLM:
    return tiny_cplm(cplm_config(copy_qk_norm=True), seed=3, gate_bias=1.0)


def generate(model: CPLMForCausalLM, ids: torch.Tensor, mask: torch.Tensor | None = None, **kwargs):
    mask = torch.ones_like(ids) if mask is None else mask
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=PAD_ID, return_dict_in_generate=True,
        **kwargs,
    )


def test_greedy_cached_equals_uncached_tokens_and_step_log_probs(model: CPLMForCausalLM) -> None:
    prompt = repetitive_ids(2, 7, seed=1)
    cached = generate(model, prompt, do_sample=False, use_cache=True, output_logits=True)
    uncached = generate(model, prompt, do_sample=False, use_cache=False)
    # integer tokens: argmaxes of log-probs that agree within STEP_ATOL (no closer tie in these prompts)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert cached.sequences.shape[1] > prompt.shape[1] + 1
    with torch.no_grad():
        for step, step_log_probs in enumerate(cached.logits):
            prefix = cached.sequences[:, : prompt.shape[1] + step]
            full = model(prefix).logits[:, -1]
            torch.testing.assert_close(step_log_probs, full, atol=STEP_ATOL, rtol=0)
    # the copy head takes part: generated tokens are copies of earlier tokens under the repetitive prompt
    # a sum of 300 fp32 probabilities: random-walk rounding sqrt(300) * 2^-24 ~ 1e-6 (+ exp of |log p| <~ 7)
    assert cached.logits[-1].exp().sum(-1).sub(1).abs().max() < 1e-5


def test_generation_after_an_eod_copies_only_from_the_current_document(model: CPLMForCausalLM) -> None:
    """Prompts whose last document follows an EOD: cached = uncached, every step equals the full forward, and
    the copy head (reset at EOD) gives different steps than a model copying across the EOD."""
    prompt = repetitive_ids(2, 12, seed=7)
    prompt[:, 8] = BOS_EOS_ID  # the current document is the last 3 tokens
    cached = generate(model, prompt, do_sample=False, use_cache=True, output_logits=True)
    uncached = generate(model, prompt, do_sample=False, use_cache=False)
    # integer tokens, as above
    assert torch.equal(cached.sequences, uncached.sequences)
    across = tiny_cplm(cplm_config(copy_qk_norm=True, copy_reset_at_eod=False), seed=3, gate_bias=1.0)
    with torch.no_grad():
        for step, step_log_probs in enumerate(cached.logits):
            prefix = cached.sequences[:, : prompt.shape[1] + step]
            torch.testing.assert_close(step_log_probs, model(prefix).logits[:, -1], atol=STEP_ATOL, rtol=0)
        first = across(prompt).logits[:, -1]
    assert (first - cached.logits[0]).abs().max() > 0.1


def test_sampling_cached_equals_uncached(model: CPLMForCausalLM) -> None:
    prompt = repetitive_ids(3, 6, seed=2)
    torch.manual_seed(123)
    cached = generate(model, prompt, do_sample=True, top_k=0, use_cache=True).sequences
    torch.manual_seed(123)
    uncached = generate(model, prompt, do_sample=True, top_k=0, use_cache=False).sequences
    # integer tokens drawn with the same seed from distributions that agree within STEP_ATOL
    assert torch.equal(cached, uncached)


def test_beam_search_reorders_the_copy_state(model: CPLMForCausalLM) -> None:
    prompt = repetitive_ids(2, 8, seed=4)
    cached = generate(model, prompt, num_beams=4, do_sample=False, use_cache=True).sequences
    uncached = generate(model, prompt, num_beams=4, do_sample=False, use_cache=False).sequences
    # integer tokens, as above
    assert torch.equal(cached, uncached)


def test_left_padded_batch_generates_like_single_prompts(model: CPLMForCausalLM) -> None:
    prompts = [repetitive_ids(1, 9, seed=5)[0], repetitive_ids(1, 4, seed=6)[0]]
    width = max(len(p) for p in prompts)
    ids = torch.full((2, width), PAD_ID)
    mask = torch.zeros((2, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    batch = generate(model, ids, mask, do_sample=False, output_logits=True)
    for row, prompt in enumerate(prompts):
        single = generate(model, prompt[None], do_sample=False, output_logits=True)
        assert torch.equal(batch.sequences[row, width:], single.sequences[0, len(prompt):])  # integer tokens
        for batch_step, single_step in zip(batch.logits, single.logits):
            # batched (left-padded) vs single prompts: every matmul has other shapes, which BLAS blocks
            # differently, and the cache carries those differences through 10 generated steps: 10 x STEP_ATOL
            torch.testing.assert_close(batch_step[row], single_step[0], atol=1e-4, rtol=0)


def test_cropped_cache_crops_the_copy_state(model: CPLMForCausalLM) -> None:
    ids = repetitive_ids(2, 14, seed=7)
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :10], use_cache=True, past_key_values=cache)
        assert getattr(cache, COPY_STATE_ATTR).length == 10
        cache.crop(-4)  # drop the last 4 positions, as assisted decoding does with rejected drafts
        resumed = model(ids[:, 6:], use_cache=True, past_key_values=cache).logits
        full = model(ids).logits
    torch.testing.assert_close(resumed, full[:, 6:], atol=STEP_ATOL, rtol=0)
    assert getattr(cache, COPY_STATE_ATTR).length == 14


def test_cache_without_copy_state_is_rejected() -> None:
    config = cplm_config()
    cplm = tiny_cplm(config)
    plain = LlamaForCausalLM(llama_config_like(config)).eval()
    ids = repetitive_ids(1, 5)
    cache = DynamicCache()
    with torch.no_grad():
        plain(ids, use_cache=True, past_key_values=cache)
        with pytest.raises(ValueError, match="no copy-key state"):
            cplm(ids[:, -1:], use_cache=True, past_key_values=cache)


def test_static_cache_is_rejected(model: CPLMForCausalLM) -> None:
    with pytest.raises(ValueError, match="dynamic"):
        generate(model, repetitive_ids(1, 5), do_sample=False, cache_implementation="static")


def test_assisted_decoding_matches_greedy(model: CPLMForCausalLM) -> None:
    """Assisted decoding crops both models' caches (and so their copy states) between rounds."""
    prompt = repetitive_ids(1, 7, seed=8)
    assistant = tiny_cplm(cplm_config(), seed=9, gate_bias=1.0)
    assisted = generate(model, prompt, assistant_model=assistant, do_sample=False).sequences
    plain = generate(model, prompt, do_sample=False, use_cache=False).sequences
    # integer tokens: assisted decoding verifies every draft with the main model's own argmax
    assert torch.equal(assisted, plain)


def test_sentinel_mixing_generates_cached_as_uncached_and_resets_at_eod() -> None:
    """`copy_mixing: sentinel` reads each copy head's candidate lse, recomputed from the cached copy keys for
    every new query: cached = uncached steps over an EOD, and candidates reset at the EOD."""
    model = tiny_cplm(cplm_config(copy_qk_norm=True, copy_mixing="sentinel"), seed=3, gate_bias=2.0)
    assert model.copy_head.gate.weight.shape == (3, 64)  # one sentinel per copy head
    prompt = repetitive_ids(2, 12, seed=7)
    prompt[:, 8] = BOS_EOS_ID  # the current document is the last 3 tokens
    cached = generate(model, prompt, do_sample=False, use_cache=True, output_logits=True)
    uncached = generate(model, prompt, do_sample=False, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)  # integer tokens, as above
    with torch.no_grad():
        for step, step_log_probs in enumerate(cached.logits):
            prefix = cached.sequences[:, : prompt.shape[1] + step]
            torch.testing.assert_close(step_log_probs, model(prefix).logits[:, -1], atol=STEP_ATOL, rtol=0)
        as_gate = tiny_cplm(cplm_config(copy_qk_norm=True), seed=3, gate_bias=2.0)
        across = tiny_cplm(cplm_config(copy_qk_norm=True, copy_mixing="sentinel", copy_reset_at_eod=False), seed=3,
                           gate_bias=2.0)
        gate_first, across_first = as_gate(prompt).logits[:, -1], across(prompt).logits[:, -1]
    assert (gate_first - cached.logits[0]).abs().max() > 0.1  # the sentinel rule, not the gate, mixed
    assert (across_first - cached.logits[0]).abs().max() > 0.1  # candidates before the EOD are not used
    # a sum of 300 fp32 probabilities, as in the greedy test: 1e-5
    assert cached.logits[-1].exp().sum(-1).sub(1).abs().max() < 1e-5
