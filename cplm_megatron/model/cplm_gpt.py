"""`CPLMGPTModel`: Megatron-Core's GPTModel whose last stage returns the Copy-Paste mixture loss.

The model keeps GPTModel's contract (per-token loss ``[b, s]`` when labels are given, a
distribution over the vocabulary otherwise), so Megatron's schedules, loss functions and pipeline
parallelism work unchanged. Without labels it returns the mixture's log-probabilities where
GPTModel returns logits (a softmax of them is the mixture, as for the HF export). With
``copy_head=None`` it is exactly the plain backbone: same parameters, same loss bits.

The head hooks into GPTModel's private ``_postprocess``: Megatron has no public post-processing
hook in every supported version (0.18 added ``output_processor``; 0.16/0.17 have none). The
override names every argument it reads, and `check_megatron_postprocess` compares the installed
signature with the ones this file was written against when the model is built.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, Optional, Tuple

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel

from cplm_megatron.errors import UserError
from cplm_megatron.model.copy_head import CopyHeadConfig, CopyHeadOutput, CopyPasteHead

SUPPORTED_MEGATRON_CORE = "0.16.1 ... 0.19.x"
_POSTPROCESS_0_16 = (
    "hidden_states", "input_ids", "position_ids", "labels", "rotary_pos_emb", "rotary_pos_cos", "rotary_pos_sin",
    "mtp_in_postprocess", "loss_mask", "decoder_input", "attention_mask", "inference_params", "packed_seq_params",
    "sequence_len_offset", "runtime_gather_output", "extra_block_kwargs", "inference_context",
)
# GPTModel._postprocess's parameters (after self) in each supported megatron-core release.
POSTPROCESS_SIGNATURES: Dict[str, Tuple[str, ...]] = {
    "0.16": _POSTPROCESS_0_16,
    "0.17": _POSTPROCESS_0_16 + ("is_spec_decode",),
    "0.18-0.19": _POSTPROCESS_0_16[:11] + ("padding_mask",) + _POSTPROCESS_0_16[11:]
    + ("output_processor", "output_processor_context"),
}


class UnsupportedMegatronError(UserError):
    """The installed megatron-core is not one CPLMGPTModel was written and tested against."""


def check_megatron_postprocess(postprocess: Any = None) -> None:
    """Raise unless GPTModel._postprocess (or `postprocess`) has a signature listed in POSTPROCESS_SIGNATURES."""
    import megatron.core

    postprocess = GPTModel._postprocess if postprocess is None else postprocess
    params = tuple(inspect.signature(postprocess).parameters)[1:]
    if params not in POSTPROCESS_SIGNATURES.values():
        version = getattr(megatron.core, "__version__", "unknown")
        raise UnsupportedMegatronError(
            f"megatron-core {version} is not supported by CPLMGPTModel: the Copy-Paste head overrides "
            f"GPTModel._postprocess, whose parameters here are ({', '.join(params)}) and match none of the "
            f"supported releases ({SUPPORTED_MEGATRON_CORE}); install a supported megatron-core, e.g. "
            "pip install 'megatron-core>=0.16.1,<0.20'"
        )


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
class _HeadRequest:
    """What `forward` tells `_postprocess` beyond GPTModel's arguments (set for the duration of one call)."""

    document_ids: Optional[torch.Tensor]
    output: str


class CPLMGPTModel(GPTModel):
    """GPTModel + an optional Copy-Paste head on the last pipeline stage."""

    OUTPUTS = ("loss", "loss_and_copy", "log_probs", "log_probs_gathered")

    def __init__(self, *args: Any, copy_head: Optional[CopyHeadConfig] = None, **kwargs: Any):
        check_megatron_postprocess()
        super().__init__(*args, **kwargs)
        if self.config.mtp_num_layers:
            raise ValueError("multi-token prediction (mtp_num_layers) is not supported with CPLMGPTModel")
        self.copy_cfg = copy_head if copy_head is not None and copy_head.enabled else None
        if self.copy_cfg is not None and self.post_process:
            self.copy_head = CopyPasteHead(
                self.config.hidden_size, self.copy_cfg, self.config.init_method_std, self.config.params_dtype
            )
        else:
            self.copy_head = None
        self._request = _HeadRequest(None, "loss")

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
        self._request = _HeadRequest(document_ids, output)
        try:
            return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs)
        finally:
            self._request = _HeadRequest(None, "loss")

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

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, *, loss_mask=None,
                     inference_context=None, runtime_gather_output=None, **megatron_args):
        """GPTModel's post-processing with the head on the last stage. Reads hidden_states, input_ids,
        labels, loss_mask, inference_context, runtime_gather_output; the other arguments of the installed
        release (POSTPROCESS_SIGNATURES) go to GPTModel._postprocess untouched when the head is not involved."""
        plain = partial(super()._postprocess, hidden_states, input_ids, position_ids, labels, loss_mask=loss_mask,
                        inference_context=inference_context, runtime_gather_output=runtime_gather_output,
                        **megatron_args)
        if not self.post_process:
            return plain()
        if self.copy_head is not None and (inference_context is not None
                                           or megatron_args.get("output_processor") is not None):
            raise NotImplementedError(
                "Megatron-native inference (inference_context / output_processor) is not supported with the "
                "Copy-Paste head: it would return the LM head's logits without the head. Score with labels "
                "(output='log_probs_gathered'), call the model without labels (mixture log-probs), or export "
                "with tools/convert_to_hf.py and generate with the HF model (it caches the copy keys)"
            )
        request = self._request
        if labels is not None and request.output.startswith("log_probs"):
            return self.mixture_log_probs(hidden_states, labels, loss_mask, request.document_ids,
                                          gather=request.output == "log_probs_gathered")
        if self.copy_head is None:
            return plain()
        if labels is None:  # the mixture's log-probs where GPTModel returns logits
            gather = runtime_gather_output if runtime_gather_output is not None else not self.parallel_output
            return self.mixture_log_probs(hidden_states, labels_from_inputs(input_ids), loss_mask,
                                          request.document_ids, gather)
        lm_ce = self.language_model_ce(hidden_states, labels)
        out: CopyHeadOutput = self.copy_head(self._full_sequence(hidden_states), lm_ce, labels, loss_mask,
                                             request.document_ids)
        return (out.loss, out) if request.output == "loss_and_copy" else out.loss

    def language_model_ce(self, hidden_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """-log p_LM(y_t) [b, s] from the vocab-parallel output layer and cross entropy (as GPTModel's loss)."""
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
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
