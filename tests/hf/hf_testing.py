"""Helpers shared by the HF model/export tests: tiny configs and models, a tokenizer, an offline env."""

import copy
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, PreTrainedTokenizerFast

from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.hf.modeling_cplm import CPLMForCausalLM

VOCAB_SIZE = 300
BOS_EOS_ID = 0  # "<|endoftext|>" in the test tokenizer
PAD_ID = 1  # "<|pad|>"

BACKBONE = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": BOS_EOS_ID,
    "eos_token_id": BOS_EOS_ID,
    "pad_token_id": PAD_ID,
}
COPY_HEAD = {"copy_heads": 3, "copy_head_dim": 16}
# A Qwen3 decoder under the copy head (CPLMConfig's cplm_backbone): qk-norm, head_dim != hidden/heads, RoPE base 1e6
QWEN3 = {"cplm_backbone": "qwen3", "head_dim": 24, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}
# fp32 log-probs (|log p| <~ 7, hidden 64, intermediate 128) over a KV cache vs over the whole prefix: attention
# and copy sums in other orders, random-walk rounding ~sqrt(128) * 2^-24 * 7 ~ 5e-6 -> 1e-5
STEP_ATOL = 1e-5
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def cplm_config(**overrides) -> CPLMConfig:
    """A tiny GQA CPLM config (hidden 64, 2 layers, 4 heads / 2 kv heads, 3 copy heads of width 16)."""
    return CPLMConfig(**{**BACKBONE, **COPY_HEAD, **overrides})


def llama_config_like(config: CPLMConfig) -> LlamaConfig:
    """The plain Llama config of the same backbone."""
    fields = {name: getattr(config, name) for name in BACKBONE}
    return LlamaConfig(**fields, tie_word_embeddings=config.tie_word_embeddings)


def tiny_cplm(config: CPLMConfig, seed: int = 0, gate_bias: float = 0.0) -> CPLMForCausalLM:
    """A random tiny CPLM whose copy head matters: sharp copy attention, gate near 0.5, non-unit norms."""
    torch.manual_seed(seed)
    model = CPLMForCausalLM(config).eval()
    head = model.copy_head
    with torch.no_grad():
        # |scores| up to ~25: sharp copy attention, yet fp32 rounding of the scores stays ~3e-6 in log p.
        head.q_proj.weight.normal_(0.0, 0.3)
        head.k_proj.weight.normal_(0.0, 0.3)
        head.gate.weight.normal_(0.0, 0.1)
        head.gate.bias.fill_(gate_bias)
        for norm in (head.q_norm, head.k_norm):
            if norm is not None:
                norm.weight.uniform_(0.5, 2.0)
    return model


def repetitive_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Token ids drawn from a few ids so that earlier positions often propose the right label."""
    generator = torch.Generator().manual_seed(seed)
    pool = torch.tensor([5, 17, 42, 99, 123, 200, 256, 299])
    return pool[torch.randint(0, len(pool), (batch, length), generator=generator)]


def train_tokenizer(out: Path) -> Path:
    """Train a byte-level BPE (300 tokens incl. specials) and save it as an HF tokenizer directory in `out`."""
    texts = [f"the quick brown fox jumps over the lazy dog {i}\ncopy paste copy paste {i * 7}" for i in range(300)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|pad|>"
    )
    assert fast.bos_token_id == BOS_EOS_ID and fast.pad_token_id == PAD_ID and len(fast) == VOCAB_SIZE
    fast.save_pretrained(out)
    return out


@torch.no_grad()
def randomize_norms(model: torch.nn.Module, seed: int) -> None:
    """Norm weights away from 1 (each different), so a swapped or misplaced norm changes the outputs."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.copy_(torch.empty(param.shape).uniform_(0.5, 1.5, generator=generator))


def assert_logits_are_the_models(logits: torch.Tensor, model: torch.nn.Module, input_ids: torch.Tensor,
                                 compute_dtype: torch.dtype = torch.float32) -> None:
    """`logits` (an export reloaded, maybe in another process) are `model`'s function of `input_ids`. Two
    evaluations of the same weights need not agree bitwise (other buffers, which BLAS may block differently), so
    both are held to the fp64 evaluation of the weights: the longest sums have 128 terms (intermediate size),
    whose random-walk rounding is ~sqrt(128) ~ 11 unit roundoffs of the compute dtype; bound 16 * u * max|logit|."""
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(input_ids).logits
    assert torch.isfinite(exact).all()
    error = (logits.double() - exact).abs().max().item()
    bound = 16 * UNIT_ROUNDOFF[compute_dtype] * exact.abs().max().item()
    assert error <= bound, f"max |logit - fp64 logit| = {error:.3g} > {bound:.3g}"
