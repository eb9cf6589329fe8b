"""`CPLMGPTModel`: Megatron-Core's GPTModel whose last stage returns the Copy-Paste mixture loss.

The model keeps GPTModel's contract (per-token loss ``[b, s]`` when labels are given, logits
otherwise), so Megatron's schedules, loss functions and pipeline parallelism work unchanged.
With ``copy_head=None`` it is exactly the plain backbone: same parameters, same loss bits.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel

from cplm_megatron.model.copy_head import CopyHeadConfig, CopyHeadOutput, CopyPasteHead


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


class CPLMGPTModel(GPTModel):
    """GPTModel + an optional Copy-Paste head on the last pipeline stage."""

    def __init__(self, *args: Any, copy_head: Optional[CopyHeadConfig] = None, **kwargs: Any):
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
        self._call_extras: Dict[str, Any] = {}

    OUTPUTS = ("loss", "loss_and_copy", "log_probs", "log_probs_gathered")

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
        """GPTModel.forward plus `document_ids` ([b, s]: copy candidates stay inside a document) and
        `output`, what the last stage returns when labels are given:
        "loss" ([b, s] per-token loss), "loss_and_copy" ((loss, CopyHeadOutput)),
        "log_probs" / "log_probs_gathered" (mixture log-probs [b, s, V/tp] / [b, s, V])."""
        if output not in self.OUTPUTS:
            raise ValueError(f"output={output!r}; expected one of {self.OUTPUTS}")
        self._call_extras = {"document_ids": document_ids, "output": output}
        try:
            return super().forward(input_ids, position_ids, attention_mask, *args, **kwargs)
        finally:
            self._call_extras = {}

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

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, *args, **kwargs):
        loss_mask = kwargs.get("loss_mask")
        output = self._call_extras.get("output", "loss")
        doc_ids = self._call_extras.get("document_ids")
        in_inference = kwargs.get("inference_context") is not None and not self.training
        if self.post_process and labels is not None and output.startswith("log_probs"):
            return self.mixture_log_probs(hidden_states, labels, loss_mask, doc_ids, output == "log_probs_gathered")
        if not self.post_process or self.copy_head is None or labels is None or in_inference:
            return super()._postprocess(hidden_states, input_ids, position_ids, labels, *args, **kwargs)
        output_weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(hidden_states, weight=output_weight)
        lm_ce = self.compute_language_model_loss(labels, logits)  # [b, s]
        out: CopyHeadOutput = self.copy_head(self._full_sequence(hidden_states), lm_ce, labels, loss_mask, doc_ids)
        return (out.loss, out) if output == "loss_and_copy" else out.loss

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
