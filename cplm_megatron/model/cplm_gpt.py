"""`CPLMGPTModel`: Megatron-Core's GPTModel whose last stage returns the Copy-Paste mixture loss.

The model keeps GPTModel's contract (per-token loss ``[b, s]`` when labels are given, a
distribution over the vocabulary otherwise), so Megatron's schedules, loss functions and pipeline
parallelism work unchanged. Without labels it returns the mixture's log-probabilities where
GPTModel returns logits (a softmax of them is the mixture, as for the HF export). With
``copy_head=None`` it is exactly the plain backbone: same parameters, same loss bits.

How the head reaches the last stage's output: on megatron-core >= 0.18 through GPTModel's public hook,
``forward(..., output_processor=..., output_processor_context=...)`` (no private method overridden); on
0.16/0.17, which have no hook, through the ``_postprocess`` override of `postprocess_shim.py`, the one place
that knows GPTModel's private signature. Both call `CPLMGPTModel.head_output`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel

from cplm_megatron.model.copy_head import CopyHeadConfig, CopyHeadOutput, CopyPasteHead
from cplm_megatron.model.lm_head_loss import check_lm_head_loss, lm_head_ce
from cplm_megatron.model.postprocess_shim import (  # noqa: F401 - re-exported: the supported releases
    POSTPROCESS_SIGNATURES,
    SUPPORTED_MEGATRON_CORE,
    PostprocessShim,
    UnsupportedMegatronError,
    check_megatron_postprocess,
)

# megatron-core >= 0.18: GPTModel.forward takes a post-processing hook (the shim is for 0.16/0.17)
USES_OUTPUT_PROCESSOR = "output_processor" in inspect.signature(GPTModel.forward).parameters


def _vocab_parallel_lse(logits: torch.Tensor) -> torch.Tensor:
    """log-sum-exp over the full vocabulary of vocab-sharded logits [..., V/tp] (fp32)."""
    logits = logits.float()
    local_max = logits.max(dim=-1, keepdim=True).values.detach()
    group = parallel_state.get_tensor_model_parallel_group()
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(local_max, op=torch.distributed.ReduceOp.MAX, group=group)
    sum_exp = torch.exp(logits - local_max).sum(dim=-1, keepdim=True)
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        sum_exp = tensor_parallel.reduce_from_tensor_model_parallel_region(sum_exp)
    return local_max + torch.log(sum_exp)


def labels_from_inputs(input_ids: torch.Tensor) -> torch.Tensor:
    """Copy candidates' labels y_j = x_{j+1} of a sequence without labels; -1 (no candidate) at the end."""
    return torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], -1)], dim=1)


@dataclass(frozen=True)
class HeadRequest:
    """What `forward` asks of the last stage beyond GPTModel's arguments (the output processor's context)."""

    document_ids: Optional[torch.Tensor]
    output: str


class CPLMGPTModel(*((GPTModel,) if USES_OUTPUT_PROCESSOR else (PostprocessShim, GPTModel))):
    """GPTModel + an optional Copy-Paste head on the last pipeline stage; the LM head's loss computed
    by Megatron (`lm_head_loss="megatron"`) or without a logits tensor ("chunked", "fused")."""

    OUTPUTS = ("loss", "loss_and_copy", "log_probs", "log_probs_gathered")
    # per-token quantities of every model: the objective, the LM head's NLL, the full distribution's NLL
    BASE_METRICS = ("loss", "lm_loss", "mix_loss")

    def metric_names(self) -> tuple:
        """The per-token quantities a training step reduces for this model (the same on every pipeline stage):
        BASE_METRICS, and the copy head's own (CopyHeadOutput.METRICS) when it has one."""
        if self.copy_cfg is None:
            return self.BASE_METRICS
        return self.BASE_METRICS + tuple(k for k in CopyHeadOutput.METRICS if k not in self.BASE_METRICS)

    def __init__(self, *args: Any, copy_head: Optional[CopyHeadConfig] = None, lm_head_loss: str = "megatron",
                 **kwargs: Any):
        if not USES_OUTPUT_PROCESSOR:
            check_megatron_postprocess()
        check_lm_head_loss(lm_head_loss)
        super().__init__(*args, **kwargs)
        self.lm_head_loss = lm_head_loss
        if self.config.mtp_num_layers:
            raise ValueError("multi-token prediction (mtp_num_layers) is not supported with CPLMGPTModel")
        self.copy_cfg = copy_head if copy_head is not None and copy_head.enabled else None
        if self.copy_cfg is not None and self.post_process:
            self.copy_head = CopyPasteHead(
                self.config.hidden_size, self.copy_cfg, self.config.init_method_std, self.config.params_dtype
            )
        else:
            self.copy_head = None

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        *args: Any,
        document_ids: Optional[torch.Tensor] = None,
        output: str = "loss",
        **kwargs: Any,
    ):
        """GPTModel.forward plus `document_ids` ([b, s]: copy candidates stay inside a document, whatever
        the attention mask does; None: one document per row) and `output`, what the last stage returns when
        labels are given: "loss" ([b, s] per-token loss), "loss_and_copy" ((loss, CopyHeadOutput)),
        "log_probs" / "log_probs_gathered" (mixture log-probs [b, s, V/tp] / [b, s, V]). Without labels
        the last stage returns the mixture log-probs (candidates from `input_ids`)."""
        if output not in self.OUTPUTS:
            raise ValueError(f"output={output!r}; expected one of {self.OUTPUTS}")
        request = HeadRequest(document_ids, output)
        if not USES_OUTPUT_PROCESSOR:
            return self.forward_through_shim(request, input_ids, position_ids, attention_mask, *args, **kwargs)
        if kwargs.get("output_processor") is not None:
            raise ValueError("CPLMGPTModel sets GPTModel's output_processor itself; pass output=... instead")
        labels = kwargs["labels"] if "labels" in kwargs else (args[1] if len(args) > 1 else None)
        if self.copy_head is None and output == "loss" and (labels is None or self.lm_head_loss == "megatron"):
            return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs)  # GPTModel's own path
        return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs,
                               output_processor=self._output_processor, output_processor_context=request)

    def _output_processor(self, *, hidden_states, labels, loss_mask, input_ids, inference_context,
                          runtime_gather_output, context: HeadRequest, **_megatron_helpers):
        """GPTModel's post-processing hook (megatron-core >= 0.18), on the last stage only."""
        self.refuse_native_inference(inference_context)
        return self.head_output(hidden_states, input_ids, labels, loss_mask, runtime_gather_output, context)

    def refuse_native_inference(self, inference_context) -> None:
        """Megatron-native inference would return the LM head's logits without the head: refused."""
        if self.copy_head is not None and inference_context is not None:
            raise NotImplementedError(
                "Megatron-native inference (inference_context / output_processor) is not supported with the "
                "Copy-Paste head: it would return the LM head's logits without the head. Score with labels "
                "(output='log_probs_gathered'), call the model without labels (mixture log-probs), or export "
                "with tools/convert_to_hf.py and generate with the HF model (it caches the copy keys)"
            )

    def head_output(self, hidden_states, input_ids, labels, loss_mask, runtime_gather_output,
                    request: HeadRequest):
        """The last stage's output for `request` from the decoder's hidden states (both hooks end here):
        mixture log-probs, the LM head's own loss (copy_head=None, lm_head_loss chunked/fused), or the
        copy mixture's per-token loss (and its CopyHeadOutput)."""
        if labels is not None and request.output.startswith("log_probs"):
            return self.mixture_log_probs(hidden_states, labels, loss_mask, request.document_ids,
                                          gather=request.output == "log_probs_gathered")
        if self.copy_head is None:
            if labels is None:  # GPTModel's logits, as its own path returns them
                gather = runtime_gather_output if runtime_gather_output is not None else not self.parallel_output
                output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights \
                    else None
                logits, _ = self.output_layer(hidden_states, weight=output_weight, runtime_gather_output=gather)
                return logits.transpose(0, 1).contiguous()
            return self.language_model_ce(hidden_states, labels)
        if labels is None:  # the mixture's log-probs where GPTModel returns logits
            gather = runtime_gather_output if runtime_gather_output is not None else not self.parallel_output
            return self.mixture_log_probs(hidden_states, labels_from_inputs(input_ids), loss_mask,
                                          request.document_ids, gather)
        lm_ce = self.language_model_ce(hidden_states, labels)
        out: CopyHeadOutput = self.copy_head(self._full_sequence(hidden_states), lm_ce, labels, loss_mask,
                                             request.document_ids)
        return (out.loss, out) if request.output == "loss_and_copy" else out.loss

    def _full_sequence(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[s(/tp), b, h] -> [b, s, h]; under sequence parallelism gather the sequence first.

        The head runs identically on every TP rank, so the backward of the gather only splits
        (tensor_parallel_output_grad=False) instead of reduce-scattering identical gradients.
        """
        if self.config.sequence_parallel:
            hidden_states = tensor_parallel.gather_from_sequence_parallel_region(
                hidden_states, tensor_parallel_output_grad=False
            )
        return hidden_states.transpose(0, 1)

    def language_model_ce(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """-log p_LM(y_t) [b, s] from the vocab-parallel output layer and cross entropy (as GPTModel's loss),
        or the same values from `lm_head_ce` without a logits tensor."""
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if self.lm_head_loss != "megatron":
            return lm_head_ce(hidden_states, self.output_layer, labels, self.lm_head_loss, weight=output_weight)
        logits, _ = self.output_layer(hidden_states, weight=output_weight)
        return self.compute_language_model_loss(labels, logits)

    @torch.no_grad()
    def mixture_log_probs(
        self,
        hidden_states: torch.Tensor,
        labels: torch.Tensor,
        loss_mask: Optional[torch.Tensor] = None,
        document_ids: Optional[torch.Tensor] = None,
        gather: bool = False,
    ) -> torch.Tensor:
        """Log-probabilities of the full mixed distribution, [b, s, V/tp] (or [b, s, V] if gather).

        hidden_states: the decoder output [s(/tp), b, h] of this (last) stage; labels give the copy
        candidates (y_j = x_{j+1}; use -1 where unknown). Without a copy head: the LM log-probs.
        """
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(hidden_states, weight=output_weight)  # [s, b, V/tp]
        logits = logits.transpose(0, 1).float()
        lm_log_probs = logits - _vocab_parallel_lse(logits)
        if self.copy_head is not None:
            tp_rank = parallel_state.get_tensor_model_parallel_rank()
            vocab_start = tp_rank * logits.shape[-1]
            log_probs = self.copy_head.mixture_log_probs(
                self._full_sequence(hidden_states), lm_log_probs, labels, vocab_start, loss_mask, document_ids
            )
        else:
            log_probs = lm_log_probs
        if gather and parallel_state.get_tensor_model_parallel_world_size() > 1:
            log_probs = tensor_parallel.gather_from_tensor_model_parallel_region(log_probs.contiguous())
        return log_probs
