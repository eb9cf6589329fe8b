"""Parameter counts, FLOPs per token and per-GPU memory estimates, from the config alone.

Conventions (stated so numbers can be compared with other stacks):
* FLOPs count matrix multiplies only (2·m·n·k), attention scores and values at full (non-causal)
  T×T cost like the PaLM/Megatron MFU convention; training = 3 × forward (+1 forward of the
  transformer layers with full activation recompute).
* The Copy-Paste head adds its q/k/gate projections and its T×T score product (no value product).
* Memory estimates are for mixed precision (bf16 weights, fp32 grads/master/Adam states, Megatron
  defaults) unless `param_bytes=4`; activations follow Korthikanti et al. 2022 adapted to GQA/SwiGLU,
  with flash attention (no T×T activations) — an estimate to plan layouts, not a measurement.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional

from cplm_megatron.model.config import ModelConfig

GIB = 1024**3


@dataclass
class CopyHeadShape:
    """The parts of the copy-head config that determine its size."""

    heads: int = 4
    head_dim: int = 64
    qk_norm: bool = False


def layer_params(m: ModelConfig) -> int:
    """Parameters of one transformer layer."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.kv_heads * m.head_dim
    norm = h * (2 if m.normalization == "LayerNorm" else 1)
    fc1_out = m.ffn_hidden_size * (2 if m.gated else 1)
    n = 2 * norm + h * (q + 2 * kv) + q * h + h * fc1_out + m.ffn_hidden_size * h
    if m.add_bias_linear:
        n += (q + 2 * kv) + h + fc1_out + h
    return n


def embedding_params(m: ModelConfig) -> int:
    """Word (padded vocab) and learned position embeddings."""
    n = m.padded_vocab_size * m.hidden_size
    if m.position_embedding == "learned_absolute":
        n += m.max_position_embeddings * m.hidden_size
    return n


def backbone_params(m: ModelConfig) -> int:
    """All backbone parameters (tied embeddings counted once)."""
    final_norm = m.hidden_size * (2 if m.normalization == "LayerNorm" else 1)
    output = 0 if m.tie_embeddings else m.padded_vocab_size * m.hidden_size
    return embedding_params(m) + m.num_layers * layer_params(m) + final_norm + output


def copy_head_params(m: ModelConfig, c: Optional[CopyHeadShape]) -> int:
    """docs/design.md: 2·d·H_c·d_c + d + 1 (+ 2·d_c with q/k RMSNorm)."""
    if c is None:
        return 0
    return 2 * m.hidden_size * c.heads * c.head_dim + m.hidden_size + 1 + (2 * c.head_dim if c.qk_norm else 0)


def forward_flops_per_token(m: ModelConfig, seq_len: int, c: Optional[CopyHeadShape] = None) -> Dict[str, float]:
    """Forward matmul FLOPs per token, by component."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.kv_heads * m.head_dim
    fc1_out = m.ffn_hidden_size * (2 if m.gated else 1)
    dense = 2 * (h * (q + 2 * kv) + q * h + h * fc1_out + m.ffn_hidden_size * h)
    attention = 2 * 2 * seq_len * q  # QK^T and AV
    out = {
        "layers_dense": m.num_layers * dense,
        "layers_attention": m.num_layers * attention,
        "lm_head": 2 * h * m.padded_vocab_size,
        "copy_head": 0.0,
    }
    if c is not None:
        out["copy_head"] = 2 * (2 * h * c.heads * c.head_dim + h) + 2 * seq_len * c.heads * c.head_dim
    return out


def train_flops_per_token(
    m: ModelConfig, seq_len: int, c: Optional[CopyHeadShape] = None, recompute: str = "none"
) -> float:
    """Training FLOPs per token: forward + backward (2x), + layer forward again under full recompute."""
    f = forward_flops_per_token(m, seq_len, c)
    total = 3 * sum(f.values())
    if recompute == "full":
        total += f["layers_dense"] + f["layers_attention"]
    elif recompute == "selective":
        total += f["layers_attention"]  # core attention recomputed
    return float(total)


def _stage_params(m: ModelConfig, c: Optional[CopyHeadShape], tp: int, pp: int) -> Dict[str, float]:
    """Parameters held by one GPU on the first and the last pipeline stage."""
    layers = m.num_layers / pp * layer_params(m) / tp
    emb = embedding_params(m) / tp
    out = m.padded_vocab_size * m.hidden_size / tp
    head = copy_head_params(m, c)  # replicated across TP
    final_norm = m.hidden_size * (2 if m.normalization == "LayerNorm" else 1)
    if pp == 1:
        both = layers + emb + (0 if m.tie_embeddings else out) + head + final_norm
        return {"first": both, "last": both}
    return {"first": layers + emb, "last": layers + out + head + final_norm}


def activation_bytes_per_layer_token(m: ModelConfig, tp: int, sp: bool, recompute: str) -> float:
    """Stored activations (bytes, 16-bit) for one token in one layer on one GPU."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim, m.kv_heads * m.head_dim
    hid = h / tp if sp else h
    if recompute == "full":
        return 2 * hid  # only the layer input
    fc1_out = m.ffn_hidden_size * (2 if m.gated else 1)
    per = 2 * (
        4 * hid  # norm inputs/outputs (attention and MLP)
        + (q + 2 * kv) / tp  # q, k, v
        + 2 * q / tp  # attention output (flash) and projection input
        + fc1_out / tp
        + m.ffn_hidden_size / tp  # fc1 output, activation output
    )
    per += hid  # residual dropout masks (1 byte)
    return per


def memory_estimate(
    m: ModelConfig,
    c: Optional[CopyHeadShape] = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    seq_len: int = 2048,
    micro_batch: int = 1,
    sp: bool = False,
    param_bytes: int = 2,
    recompute: str = "none",
) -> Dict[str, object]:
    """Per-GPU memory (GiB) on the most loaded pipeline stage, with and without the distributed optimizer."""
    stage = _stage_params(m, c, tp, pp)
    params = max(stage.values())
    weights = params * param_bytes
    grads = params * 4  # fp32 main-grad buffer
    master = params * 4 if param_bytes < 4 else 0
    adam = params * 8
    opt_plain = master + adam
    opt_dist = opt_plain / dp
    tokens = seq_len * micro_batch
    in_flight = pp  # 1F1B: the first stage holds up to pp micro-batches
    layers_per_stage = m.num_layers / pp
    act_layers = activation_bytes_per_layer_token(m, tp, sp, recompute) * tokens * layers_per_stage * in_flight
    logits = tokens * m.padded_vocab_size / tp * 4 * 2  # fp32 logits + their grad on the last stage
    copy = 0.0
    if c is not None:
        copy = tokens * (2 * 2 * c.heads * c.head_dim + 4 * 2 * c.heads)  # q, k (bf16) + 2 fp32 stats
    activations = act_layers + logits + copy
    return {
        "params_per_gpu": int(params),
        "weights_gib": weights / GIB,
        "grads_gib": grads / GIB,
        "optimizer_gib": opt_plain / GIB,
        "optimizer_distributed_gib": opt_dist / GIB,
        "activations_gib": activations / GIB,
        "total_gib": (weights + grads + opt_plain + activations) / GIB,
        "total_distributed_optimizer_gib": (weights + grads + opt_dist + activations) / GIB,
        "assumptions": (
            f"{'bf16' if param_bytes == 2 else 'fp32'} params, fp32 grads/Adam, flash attention, "
            f"1F1B with {in_flight} micro-batch(es) in flight, recompute={recompute}, sp={sp}"
        ),
    }


def model_summary(m: ModelConfig, c: Optional[CopyHeadShape], seq_len: int) -> Dict[str, object]:
    """Counts and FLOPs in one dict (for model_info and run logs)."""
    backbone = backbone_params(m)
    head = copy_head_params(m, c)
    return {
        "preset": m.preset,
        "backbone_params": backbone,
        "copy_head_params": head,
        "total_params": backbone + head,
        "forward_flops_per_token": forward_flops_per_token(m, seq_len, c),
        "train_flops_per_token": train_flops_per_token(m, seq_len, c),
        "train_flops_per_token_backbone_only": train_flops_per_token(m, seq_len, None),
        "copy_head": asdict(c) if c else None,
        "seq_len": seq_len,
    }
