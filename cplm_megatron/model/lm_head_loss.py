"""The LM head's per-token cross entropy, with or without a logits tensor (`model.lm_head_loss`).

``megatron``: Megatron-Core's output layer (``ColumnParallelLinear``, logits ``[s, b, V/tp]``) and its
``vocab_parallel_cross_entropy`` -- fp32 logits and their gradient for every token of the
micro-batch. ``chunked`` / ``fused``: the same values and gradients from
:func:`cplm_kernels.linear_cross_entropy`, which never holds more than one ``tokens x vocab`` tile of
logits (torch element-wise ops, or one Triton pass per tile). All three return the per-token CE
``[b, s]`` that GPTModel's loss path and the copy mixture consume.

Megatron's output layer is mirrored exactly: the same weight (the output layer's own, or the shared
embedding weight when tied -- its gradient reaches that parameter through autograd, and Megatron's
embedding-group all-reduce syncs the copies across pipeline stages as before), the same
vocab-parallel reduction, sequence-parallel inputs gathered in forward and re-gathered in backward
with a reduce-scattered input gradient, otherwise an all-reduced one.
"""
from __future__ import annotations

from typing import Optional

import torch

import cplm_kernels
from cplm_kernels.linear_ce import CEChunks, linear_cross_entropy
from cplm_megatron.errors import ConfigError

LM_HEAD_LOSSES = ("megatron", "chunked", "fused")


def check_lm_head_loss(impl: str) -> None:
    """Fail early for an unknown name, or ``fused`` where the Triton kernels cannot run."""
    if impl not in LM_HEAD_LOSSES:
        raise ConfigError(f"model.lm_head_loss={impl!r}; expected one of {', '.join(LM_HEAD_LOSSES)}")
    if impl == "fused" and not cplm_kernels.fused_available():
        raise ConfigError("model.lm_head_loss=fused needs triton and a CUDA device (or TRITON_INTERPRET=1); "
                          "use model.lm_head_loss=chunked on CPU")


def runnable_here(impl: str) -> str:
    """``impl``, or ``chunked`` for ``fused`` where the Triton kernels cannot run: for loading a model
    trained on GPUs elsewhere (evaluation, conversion); the two compute the same values. ``auto`` (a config that
    was never resolved by a launch) is Megatron's path: scoring one process, the fastest."""
    if impl == "auto":
        return "megatron"
    return "chunked" if impl == "fused" and not cplm_kernels.fused_available() else impl


def megatron_lm_head_ce(hidden_states: torch.Tensor, output_layer, labels: torch.Tensor,
                        weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Megatron's path: ``output_layer`` logits then ``vocab_parallel_cross_entropy``; [b, s] fp32.

    Equals ``GPTModel.compute_language_model_loss(labels, output_layer(hidden_states, weight)[0])``
    without cross-entropy fusion (the fused variants compute the same values)."""
    from megatron.core import tensor_parallel

    logits, _ = output_layer(hidden_states, weight=weight)
    loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous())
    return loss.transpose(0, 1).contiguous()


def lm_head_ce(
    hidden_states: torch.Tensor,
    output_layer,
    labels: torch.Tensor,
    impl: str,
    weight: Optional[torch.Tensor] = None,
    chunks: Optional[CEChunks] = None,
) -> torch.Tensor:
    """Per-token LM cross entropy [b, s] (fp32) of the last stage's final-normed ``hidden_states``.

    hidden_states: ``[s(/tp under SP), b, h]`` as GPTModel's ``_postprocess`` receives them;
    output_layer: the model's ``ColumnParallelLinear``; labels: ``[b, s]`` token ids;
    weight: the shared embedding weight when input and output embeddings are tied (as GPTModel
    passes it to ``output_layer``), else ``None``. ``chunks`` overrides the tile shape.
    """
    if impl == "megatron":
        return megatron_lm_head_ce(hidden_states, output_layer, labels, weight)
    check_lm_head_loss(impl)
    if weight is None:
        weight = output_layer.weight
    if getattr(output_layer, "bias", None) is not None:
        raise ConfigError(f"model.lm_head_loss={impl} supports an output layer without bias (GPT's LM head)")
    if output_layer.config.defer_embedding_wgrad_compute:
        raise ConfigError(f"model.lm_head_loss={impl} computes the output weight's gradient itself: "
                          "unset defer_embedding_wgrad_compute")
    group = getattr(output_layer, "tp_group", None)
    if group is None:
        from megatron.core import parallel_state

        group = parallel_state.get_tensor_model_parallel_group()
    world = group.size()
    vocab_start = group.rank() * weight.shape[0]  # Megatron's VocabUtility: equal contiguous slices
    b = labels.shape[0]
    targets = labels.transpose(0, 1).reshape(-1)  # [s * b] in the row order of hidden_states [s, b, h]
    loss = linear_cross_entropy(
        hidden_states.reshape(-1, hidden_states.shape[-1]), weight, targets, impl=impl, vocab_start=vocab_start,
        group=group if world > 1 else None, sequence_parallel=output_layer.sequence_parallel and world > 1,
        chunks=chunks,
    )
    return loss.view(-1, b).transpose(0, 1).contiguous()
