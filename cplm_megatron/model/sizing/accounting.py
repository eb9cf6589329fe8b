"""Parameter counts, FLOPs per token and per-GPU memory estimates, from the config alone.

Conventions (stated so numbers can be compared with other stacks):
* FLOPs count matrix multiplies only (2·m·n·k), attention scores and values at full (non-causal)
  T×T cost like the PaLM/Megatron MFU convention; training = 3 × forward (+1 forward of the
  transformer layers with full activation recompute).
* The Copy-Paste head adds its q/k/gate projections and its T×T score product (no value product).
* Memory estimates are for mixed precision (bf16 weights, fp32 grads/master/Adam states, Megatron
  defaults) unless `param_bytes=4`; activations follow Korthikanti et al. 2022 adapted to GQA/SwiGLU,
  with the core attention in use (`attention_bytes`): SDPA/flash keeps no T×T activations, megatron-core's
  unfused DotProductAttention keeps [b, heads/tp, T, T] probabilities — an estimate to plan layouts, not a
  measurement.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Dict, Optional

from cplm_megatron.model.backbones import backbone
from cplm_megatron.model.config import ModelConfig

if TYPE_CHECKING:  # cplm_kernels imports torch: only the tiled loss's estimate needs it (the GPU check's
    from cplm_kernels.linear_ce import CEChunks  # summary step estimates Megatron's path without torch)

GIB = 1024**3


@dataclass
class CopyHeadShape:
    """The parts of the copy-head config that determine its size."""

    heads: int = 4
    head_dim: int = 64
    qk_norm: bool = False
    mixing: str = "gate"  # copy_head.mixing: sentinel has one gate row per copy head

    @classmethod
    def of(cls, copy_head) -> Optional["CopyHeadShape"]:
        """The shape of a `copy_head` config section (None when the head is disabled)."""
        c = copy_head
        return cls(c.heads, c.head_dim, c.qk_norm, c.mixing) if c.enabled else None


def layer_params(model: ModelConfig) -> int:
    """Parameters of one transformer layer."""
    h, q, kv = model.hidden_size, model.num_attention_heads * model.head_dim, model.kv_heads * model.head_dim
    fc1_out = model.ffn_hidden_size * (2 if model.gated else 1)
    n = backbone(model.family).layer_norm_params(model) + h * (q + 2 * kv) + q * h + h * fc1_out + model.ffn_hidden_size * h
    if model.add_bias_linear:
        n += (q + 2 * kv) + h + fc1_out + h
    return n


def embedding_params(model: ModelConfig) -> int:
    """Word (padded vocab) and learned position embeddings."""
    n = model.padded_vocab_size * model.hidden_size
    if model.position_embedding == "learned_absolute":
        n += model.max_position_embeddings * model.hidden_size
    return n


def backbone_params(model: ModelConfig) -> int:
    """All backbone parameters (tied embeddings counted once)."""
    final_norm = model.hidden_size * (2 if model.normalization == "LayerNorm" else 1)
    output = 0 if model.tie_embeddings else model.padded_vocab_size * model.hidden_size
    return embedding_params(model) + model.num_layers * layer_params(model) + final_norm + output


def copy_head_params(model: ModelConfig, copy: Optional[CopyHeadShape]) -> int:
    """docs/design.md: 2·d·H_c·d_c + rows·(d + 1) (+ 2·d_c with q/k RMSNorm); the gate's rows are 1 (gate,
    constant) or H_c (sentinel: one sentinel logit per copy head), as the mixing rule builds them."""
    if copy is None:
        return 0
    gate_rows = 1 if copy.mixing == "gate" else _gate_rows(copy.mixing, copy.heads)
    return (2 * model.hidden_size * copy.heads * copy.head_dim + gate_rows * (model.hidden_size + 1)
            + (2 * copy.head_dim if copy.qk_norm else 0))


def _gate_rows(mixing: str, heads: int) -> int:
    """The rule's gate rows, from the mixing registry (it imports torch: the default `gate`, one row, is counted
    without it, so the GPU check's summary step, which must not import torch, can count the default head)."""
    from cplm_megatron.model.mixing import mixing_rule

    return mixing_rule(mixing).gate_rows(heads)


def forward_flops_per_token(model: ModelConfig, seq_len: int, copy: Optional[CopyHeadShape] = None) -> Dict[str, float]:
    """Forward matmul FLOPs per token, by component."""
    h, q, kv = model.hidden_size, model.num_attention_heads * model.head_dim, model.kv_heads * model.head_dim
    fc1_out = model.ffn_hidden_size * (2 if model.gated else 1)
    dense = 2 * (h * (q + 2 * kv) + q * h + h * fc1_out + model.ffn_hidden_size * h)
    attention = 2 * 2 * seq_len * q  # QK^T and AV
    out = {
        "layers_dense": model.num_layers * dense,
        "layers_attention": model.num_layers * attention,
        "lm_head": 2 * h * model.padded_vocab_size,
        "copy_head": 0.0,
    }
    if copy is not None:
        out["copy_head"] = 2 * (2 * h * copy.heads * copy.head_dim + h) + 2 * seq_len * copy.heads * copy.head_dim
    return out


def train_flops_per_token(
    model: ModelConfig, seq_len: int, copy: Optional[CopyHeadShape] = None, recompute: str = "none"
) -> float:
    """Training FLOPs per token: forward + backward (2x), + layer forward again under full recompute."""
    f = forward_flops_per_token(model, seq_len, copy)
    total = 3 * sum(f.values())
    if recompute == "full":
        total += f["layers_dense"] + f["layers_attention"]
    elif recompute == "selective":
        total += f["layers_attention"]  # core attention recomputed
    return float(total)


def train_flops_figures(
    model: ModelConfig, seq_len: int, copy: Optional[CopyHeadShape] = None, recompute: str = "none"
) -> Dict[str, float]:
    """A run's FLOPs per token as its record keeps them: `flops_per_token` (what the hardware computes, the
    recomputed forward included), `model_flops_per_token` (the model's: no recompute) and
    `causal_flops_per_token` (the hardware's with attention over (T+1)/2 keys per query instead of T)."""
    hardware = train_flops_per_token(model, seq_len, copy, recompute)
    forward = forward_flops_per_token(model, seq_len, copy)
    copy_scores = 2 * seq_len * copy.heads * copy.head_dim if copy else 0.0  # the copy head's T x T term
    passes = 3 + (1 if recompute in ("full", "selective") else 0)  # fwd + bwd (2x) + a recomputed forward
    attention = passes * forward["layers_attention"] + 3 * copy_scores
    return {"flops_per_token": hardware, "model_flops_per_token": train_flops_per_token(model, seq_len, copy),
            "causal_flops_per_token": hardware - attention * (1 - (seq_len + 1) / (2 * seq_len))}


def _stage_params(model: ModelConfig, copy: Optional[CopyHeadShape], tp: int, pp: int) -> Dict[str, float]:
    """Parameters held by one GPU on the first and the last pipeline stage."""
    layers = model.num_layers / pp * layer_params(model) / tp
    emb = embedding_params(model) / tp
    out = model.padded_vocab_size * model.hidden_size / tp
    head = copy_head_params(model, copy)  # replicated across TP
    final_norm = model.hidden_size * (2 if model.normalization == "LayerNorm" else 1)
    if pp == 1:
        both = layers + emb + (0 if model.tie_embeddings else out) + head + final_norm
        return {"first": both, "last": both}
    return {"first": layers + emb, "last": layers + out + head + final_norm}


def activation_bytes_per_layer_token(model: ModelConfig, tp: int, sp: bool, recompute: str) -> float:
    """Stored activations (bytes, 16-bit) for one token in one layer on one GPU.

    Megatron-core's local layer spec without Transformer Engine, as autograd keeps it (measured on CPU with
    saved-tensor hooks: tests/model/test_accounting.py): the QKV projection's output (alive through the value view
    attention keeps), the rotated queries and keys, the attention output (which the output projection reads in
    place); an unfused SwiGLU (megatron-core's path without a bias, TE or `model.fused_swiglu`) keeps fc1's
    output, the SiLU output, the gated product and a copy, where the fused one keeps fc1's output and the product.
    On an H200 this puts the estimate within -0.4% to +0.9% of the measured peak at SmolLM2-135M and -1.7B
    (2026-12-04; 9-17% under without the unfused SwiGLU and the rotated q, k)."""
    h, q, kv = model.hidden_size, model.num_attention_heads * model.head_dim, model.kv_heads * model.head_dim
    hid = h / tp if sp else h
    if recompute == "full":
        return 2 * hid  # only the layer input
    ffn = model.ffn_hidden_size / tp
    fc1_out = ffn * (2 if model.gated else 1)
    mlp = fc1_out + ffn + (2 * ffn if model.gated and not model.fused_swiglu else 0)
    per = 2 * (
        4 * hid  # norm inputs/outputs (attention and MLP)
        + (q + 2 * kv) / tp  # the QKV projection's output
        + (q + kv) / tp  # rotated q and k
        + q / tp  # attention output (flash), the projection's input
        + mlp
    )
    per += hid  # residual dropout masks (1 byte)
    return per


# cplm_kernels.linear_ce.GPU_CHUNKS (tokens, vocab), without importing the kernels (and torch): the GPU check's
# summary step estimates memory torch-free; tests/model/test_accounting.py checks they agree
GPU_CE_TILE = (4096, 4096)


def lm_head_loss_bytes(model: ModelConfig, tokens: int, tp: int, lm_head_loss: str = "megatron",
                       param_bytes: int = 2, tile: Optional["CEChunks"] = None) -> Dict[str, float]:
    """Memory of the LM head's loss for one micro-batch of ``tokens`` on one GPU of the last stage:
    ``held`` from its forward until its backward, ``peak`` while it runs (inputs and the returned
    gradients excluded).

    megatron: logits ``[tokens, V/tp]`` in the compute dtype and their fp32 copy (kept as the softmax,
    overwritten in place by the gradient, cast back for the GEMMs in 16-bit training): held 4 B, peak
    ``4 + param_bytes`` B per logit (4 B in fp32), plus 9 B per token held. chunked/fused: one tile of
    logits at a time (chunked upcasts a 16-bit tile to fp32, fused reads it in place), the tile's
    hidden rows scaled by the upstream gradient, in 16-bit training fp32 accumulators for the
    hidden-state gradient and a tile's weight rows, and a few per-token vectors; the forward keeps
    12 B per token (log-sum-exp and target)."""
    logits = tokens * model.padded_vocab_size / tp
    if lm_head_loss == "megatron":  # + a target mask (bool) and masked targets (int64) per token
        return {"held": 4 * logits + 9 * tokens, "peak": (4 + (param_bytes if param_bytes < 4 else 0)) * logits}
    tile_tokens, tile_vocab = GPU_CE_TILE if tile is None else (tile.tokens, tile.vocab)
    rows, cols = min(tokens, tile_tokens), min(model.padded_vocab_size / tp, tile_vocab)
    per_tile = param_bytes + (4 if lm_head_loss == "chunked" and param_bytes < 4 else 0)
    accumulators = 4 * model.hidden_size * (tokens + cols) if param_bytes < 4 else 0
    scaled_rows = param_bytes * rows * model.hidden_size  # a tile's hidden rows times the upstream gradient
    return {"held": 12 * tokens, "peak": per_tile * rows * cols + scaled_rows + accumulators + 40 * tokens}


def attention_bytes(model: ModelConfig, seq_len: int, micro_batch: int, tp: int, layers: float, attention: str = "sdpa",
                    param_bytes: int = 2, recompute: str = "none", document_masking: bool = False,
                    cp: int = 1) -> Dict[str, float]:
    """Core-attention memory of one micro-batch on one GPU beyond the q/k/v and output activations that
    `activation_bytes_per_layer_token` counts: ``held`` from the forward to the backward (all ``layers``),
    ``peak`` while one layer runs.

    sdpa / te (flash or memory-efficient kernels): a fp32 log-sum-exp per head and token per layer; with
    document masking, one causal attention per document (no mask tensor; cplm_megatron/model/attention.py) and
    what CUDA's varlen kernel reads: q/k/v packed row after row (a copy at micro-batch > 1), key/value groups
    repeated to the query heads (GQA); an upper bound on CPU, whose per-document calls take views. megatron (unfused
    DotProductAttention): per ``[b, heads/tp, T, T]`` element, the softmax output in fp32 (kept for the
    softmax backward) and, in 16-bit training, its 16-bit copy (kept for the probabilities x values
    backward): 4 (+ ``param_bytes``) B per layer; one layer's transient scores buffer, fp32 scores and
    masked scores, and in the backward the probabilities' gradients, are the peak (3 x 4 + ``param_bytes``
    B, bounded above). Selective or full recompute keeps none of it between forward and backward.

    Context parallelism (``cp`` > 1, SDPA's all-gather; cplm_megatron/model/attention.py): the GPU's
    queries are ``seq_len / cp`` per sequence, a document mask is dense (``[b, 1, T/cp, T]``: the boolean
    mask, 1 B, and SDPA's additive bias, ``param_bytes``, once per micro-batch), and every layer keeps the
    all-gathered K/V of the whole sequence (``2 x T x groups/tp x head_dim`` per sequence) for its backward."""
    local = seq_len / cp
    tokens = local * micro_batch
    heads = model.num_attention_heads / tp
    mask = (1 + param_bytes) * micro_batch * local * seq_len if document_masking and cp > 1 else 0
    gathered = 2 * micro_batch * seq_len * (model.kv_heads / tp) * model.head_dim * param_bytes if cp > 1 else 0
    if attention == "megatron":
        elements = micro_batch * heads * seq_len * seq_len
        per_layer = (4 + (param_bytes if param_bytes < 4 else 0)) * elements
        held = 0.0 if recompute in ("selective", "full") else per_layer * layers
        peak = (3 * 4 + param_bytes) * elements
        return {"held": held + (1 if document_masking else 0) * micro_batch * seq_len * seq_len, "peak": peak}
    if cp > 1:  # GQA with a mask repeats the gathered K/V to the query heads
        repeated = 2 * heads * model.head_dim * micro_batch * seq_len * param_bytes if document_masking and \
            model.kv_heads != model.num_attention_heads else 0
        held = ((4 * heads * tokens + gathered) * layers if recompute == "none" else 0.0) + mask
        return {"held": held, "peak": 4 * heads * tokens + gathered + repeated}
    lse = 4 * heads * tokens
    # per-document attention (CUDA's varlen kernel): q/k/v packed row after row (a copy at micro-batch > 1) and,
    # with GQA, key/value copies repeated to the query heads
    gqa = model.kv_heads != model.num_attention_heads
    repeated = 2 * heads * model.head_dim * tokens * param_bytes if document_masking and gqa else 0
    if document_masking and micro_batch > 1:
        repeated += (heads + (0 if repeated else 2 * model.kv_heads / tp)) * model.head_dim * tokens * param_bytes
    held = (lse + repeated) * layers if recompute == "none" else 0.0  # recompute: core attention re-run
    return {"held": held, "peak": lse + repeated}


def optimizer_bytes_per_param(param_bytes: int, dp: int, distributed: bool, offload_fraction: float = 0.0
                              ) -> Dict[str, float]:
    """Adam state per parameter on the GPU and in host memory: fp32 moments (8 B), fp32 master weights
    (4 B) when parameters are 16-bit; sharded over ``dp`` with the distributed optimizer. CPU offload
    (megatron-core's HybridDeviceOptimizer on its precision-aware path) moves ``offload_fraction``
    of the shard -- master weights and moments -- to the host, plus a pinned fp32 gradient copy."""
    states = 8 + (4 if param_bytes < 4 else 0)
    shard = states / dp if distributed else states
    if offload_fraction and not distributed:
        raise ValueError("optimizer offload needs the distributed optimizer")
    host = offload_fraction * (shard + 4 / dp + (4 / dp if param_bytes == 4 else 0))
    return {"gpu": shard * (1 - offload_fraction), "host": host}


def memory_estimate(
    model: ModelConfig,
    copy: Optional[CopyHeadShape] = None,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    seq_len: int = 2048,
    micro_batch: int = 1,
    sp: bool = False,
    param_bytes: int = 2,
    recompute: str = "none",
    lm_head_loss: str = "megatron",
    offload_fraction: float = 0.0,
    attention: str = "sdpa",
    document_masking: bool = False,
    cp: int = 1,
) -> Dict[str, object]:
    """Per-GPU memory (GiB) on the most loaded pipeline stage, with and without the distributed optimizer.

    Stages are accounted separately under 1F1B: stage ``i`` holds ``pp - i`` micro-batches of layer
    activations in flight; the last stage adds the LM head's loss and the copy head for one micro-batch.
    ``offload_fraction`` applies to the distributed optimizer's figures; ``attention`` is the resolved
    `model.attention_impl` (sdpa, te or megatron; `attention_bytes`). ``cp``: context parallelism, each GPU
    holds seq_len / cp tokens of a sequence (activations / cp) plus the gathered K/V and copy keys; the
    distributed optimizer shards over dp x cp (megatron's data+context-parallel group)."""
    stage = _stage_params(model, copy, tp, pp)
    tokens = seq_len * micro_batch / cp
    layers_per_stage = model.num_layers / pp
    attn = attention_bytes(model, seq_len, micro_batch, tp, layers_per_stage, attention, param_bytes, recompute,
                           document_masking, cp)
    per_layer_token = activation_bytes_per_layer_token(model, tp, sp, recompute)
    per_micro_batch = per_layer_token * tokens * layers_per_stage + attn["held"]
    head = lm_head_loss_bytes(model, tokens, tp, lm_head_loss, param_bytes)
    copy_bytes = 0.0
    if copy is not None:
        copy_bytes = tokens * (2 * 2 * copy.heads * copy.head_dim + 4 * 2 * copy.heads)  # q, k (bf16) + fp32 stats
        if cp > 1:  # all-gathered copy keys (bf16), candidate labels and document ids (int64)
            copy_bytes += seq_len * micro_batch * (2 * copy.heads * copy.head_dim + 16)
    loss_side = head["peak"] + copy_bytes
    # one layer's attention transient, or the loss side on the last stage, whichever is larger (not at once)
    activations = {"first": per_micro_batch * pp + attn["peak"],
                   "last": per_micro_batch + max(loss_side, attn["peak"])}
    opt_plain = optimizer_bytes_per_param(param_bytes, dp * cp, distributed=False)
    opt_dist = optimizer_bytes_per_param(param_bytes, dp * cp, distributed=True, offload_fraction=offload_fraction)
    weights_grads = 2 + 4 if param_bytes < 4 else 4 + 4  # weights + fp32 main-grad buffer

    def total(stage_name: str, opt: Dict[str, float]) -> float:
        return stage[stage_name] * (weights_grads + opt["gpu"]) + activations[stage_name]

    busiest = max(stage, key=lambda name: total(name, opt_dist))
    params = stage[busiest]
    return {
        "params_per_gpu": int(params),
        "weights_gib": params * param_bytes / GIB,
        "grads_gib": params * 4 / GIB,
        "optimizer_gib": params * opt_plain["gpu"] / GIB,
        "optimizer_distributed_gib": params * opt_dist["gpu"] / GIB,
        "optimizer_host_gib": params * opt_dist["host"] / GIB,
        "activations_gib": activations[busiest] / GIB,
        "lm_head_loss_gib": head["peak"] / GIB,
        "lm_head_loss_held_gib": head["held"] / GIB,
        "attention_held_gib": attn["held"] / GIB,
        "attention_peak_gib": attn["peak"] / GIB,
        "busiest_stage": busiest if pp > 1 else "only",
        "total_gib": max(total(n, opt_plain) for n in stage) / GIB,
        "total_distributed_optimizer_gib": total(busiest, opt_dist) / GIB,
        "assumptions": (
            f"{'bf16' if param_bytes == 2 else 'fp32'} params, fp32 grads/Adam, "
            f"{'unfused megatron attention' if attention == 'megatron' else 'flash attention (' + attention + ')'}"
            f"{' with document masks' if document_masking else ''}, "
            f"1F1B (first stage {pp} micro-batch(es) in flight), recompute={recompute}, sp={sp}, cp={cp}, "
            f"lm_head_loss={lm_head_loss}, offload_fraction={offload_fraction}"
        ),
    }


def model_summary(model: ModelConfig, copy: Optional[CopyHeadShape], seq_len: int) -> Dict[str, object]:
    """Counts and FLOPs in one dict (for model_info and run logs)."""
    backbone = backbone_params(model)
    head = copy_head_params(model, copy)
    return {
        "preset": model.preset,
        "backbone_params": backbone,
        "copy_head_params": head,
        "total_params": backbone + head,
        "forward_flops_per_token": forward_flops_per_token(model, seq_len, copy),
        "train_flops_per_token": train_flops_per_token(model, seq_len, copy),
        "train_flops_per_token_backbone_only": train_flops_per_token(model, seq_len, None),
        "copy_head": asdict(copy) if copy else None,
        "seq_len": seq_len,
    }


def checkpoint_bytes(model: ModelConfig, copy: Optional[CopyHeadShape] = None, param_bytes: int = 2,
                     with_optimizer: bool = True) -> float:
    """Bytes of one training checkpoint on disk (all ranks together): the weights in their dtype, and with the
    optimizer its fp32 Adam moments (8 B) plus fp32 master weights (4 B) for 16-bit parameters."""
    params = backbone_params(model) + copy_head_params(model, copy)
    optimizer = (8 + (4 if param_bytes < 4 else 0)) if with_optimizer else 0
    return params * (param_bytes + optimizer)
