"""The planner's time estimate of a layout: one micro-batch's share of the training FLOPs on one GPU at a
sustained matmul rate, plus the tensor- and context-parallel traffic that the step waits for, at one node's
NVLink bus bandwidth.

It ranks layouts of the same GPUs against each other; it is not a prediction of wall time. Counted: the
sequence-parallel collectives of every layer (TP: two all-gathers and two reduce-scatters of the local
tokens' ``[T/cp, h]`` activations in the forward, the same in the backward, again under full recomputation)
and context parallelism's all-gather of each layer's K/V (``2 x T x kv_heads/tp x head_dim``) with its
gradient's reduce-scatter (again wherever core attention is recomputed), plus the copy head's gathered keys,
labels and document ids. Not counted: the data-parallel gradient reduction (once per step, overlapped with
the backward by `optimizer.overlap_grad_reduce`), the pipeline bubble (it depends on the micro-batches per
step, which the planner does not know; pipeline layouts rank after the others of their degree), GEMM
efficiency at the split shapes, and overlap of TP/CP communication with compute (neither path overlaps here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

from cplm_megatron.model.config import ModelConfig

if TYPE_CHECKING:
    from cplm_megatron.model.sizing.accounting import CopyHeadShape


@dataclass(frozen=True)
class NodeSpeed:
    """What the estimate assumes of a GPU and its links (defaults: an 8 x H100 SXM node)."""

    matmul_flops: float = 400e12  # sustained bf16 FLOP/s per GPU: ~40% of the H100's 989e12 dense peak
    link_bytes: float = 360e9  # NCCL bus bandwidth per GPU inside one NVLink node (NVLink 4: 450 GB/s a direction)


DEFAULT_SPEED = NodeSpeed()


def _passes(recompute: str, regathered: bool) -> int:
    """Forward and backward, plus the forward again where recomputation re-runs the communicating part."""
    return 2 + (1 if recompute == "full" or (recompute == "selective" and regathered) else 0)


def communication_bytes(model: ModelConfig, copy: Optional[CopyHeadShape], seq_len: int, micro_batch: int, tp: int,
                        cp: int, pp: int, recompute: str = "none", param_bytes: int = 2) -> Dict[str, float]:
    """Bytes one GPU sends for one micro-batch: ``tp`` (sequence-parallel collectives of its layers) and ``cp``
    (the gathered K/V of its layers, their gradients' reduce-scatter, the copy head's gathered keys)."""
    tokens = seq_len * micro_batch  # of the whole sequence(s); this GPU holds tokens / cp of them
    layers = model.num_layers / pp
    tp_bytes = layers * _passes(recompute, False) * 4 * (tp - 1) / tp * (tokens / cp) * model.hidden_size * param_bytes
    kv = 2 * (model.kv_heads / tp) * model.head_dim * param_bytes  # K and V of one token on one TP rank
    cp_bytes = layers * _passes(recompute, True) * (cp - 1) / cp * tokens * kv
    if copy is not None and cp > 1:  # keys (and their gradients), int64 candidate labels and document ids
        cp_bytes += (cp - 1) / cp * tokens * (2 * copy.heads * copy.head_dim * param_bytes + 16)
    return {"tp": tp_bytes, "cp": cp_bytes}


def micro_batch_seconds(model: ModelConfig, copy: Optional[CopyHeadShape], seq_len: int, micro_batch: int, tp: int,
                        cp: int, pp: int, recompute: str = "none", lm_head_loss: str = "megatron",
                        param_bytes: int = 2, speed: NodeSpeed = DEFAULT_SPEED) -> Dict[str, float]:
    """Seconds of one micro-batch on one GPU: ``compute`` (its 1/(tp x cp x pp) of the training FLOPs, with
    recomputation), ``tp`` and ``cp`` communication, and their ``total``."""
    from cplm_megatron.model.sizing.accounting import forward_flops_per_token, train_flops_per_token

    per_token = train_flops_per_token(model, seq_len, copy, recompute)
    if lm_head_loss != "megatron":  # the tiled losses recompute the logits in the backward
        per_token += forward_flops_per_token(model, seq_len, copy)["lm_head"]
    compute = per_token * seq_len * micro_batch / (tp * cp * pp) / speed.matmul_flops
    comm = communication_bytes(model, copy, seq_len, micro_batch, tp, cp, pp, recompute, param_bytes)
    out = {"compute": compute, "tp": comm["tp"] / speed.link_bytes, "cp": comm["cp"] / speed.link_bytes}
    out["total"] = sum(out.values())
    return out


def seconds_per_sequence(model: ModelConfig, copy: Optional[CopyHeadShape], seq_len: int, micro_batch: int, tp: int,
                         cp: int, pp: int, dp: int, recompute: str = "none", lm_head_loss: str = "megatron",
                         param_bytes: int = 2, speed: NodeSpeed = DEFAULT_SPEED) -> float:
    """The layout's time per training sequence (``dp`` replicas side by side, each a micro-batch of
    ``micro_batch`` sequences per `micro_batch_seconds`; no pipeline bubble): what the planner ranks."""
    t = micro_batch_seconds(model, copy, seq_len, micro_batch, tp, cp, pp, recompute, lm_head_loss, param_bytes, speed)
    return t["total"] / (dp * micro_batch)
