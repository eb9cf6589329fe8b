"""megatron-core 0.16/0.17: the Copy-Paste head through GPTModel's private ``_postprocess``.

These releases have no post-processing hook (0.18 added ``GPTModel.forward(output_processor=...)``, which
`cplm_gpt.py` uses there; this class is then not among CPLMGPTModel's bases). The override names every
argument it reads; `check_megatron_postprocess` compares the installed signature with the ones it was written
against when the model is built, so a release that changes it fails with a clear error, never silently.
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Dict, Tuple

from megatron.core.models.gpt import GPTModel

from cplm_megatron.errors import UserError

SUPPORTED_MEGATRON_CORE = "0.16.1 ... 0.19.x"
_POSTPROCESS_0_16 = (
    "hidden_states", "input_ids", "position_ids", "labels", "rotary_pos_emb", "rotary_pos_cos", "rotary_pos_sin",
    "mtp_in_postprocess", "loss_mask", "decoder_input", "attention_mask", "inference_params", "packed_seq_params",
    "sequence_len_offset", "runtime_gather_output", "extra_block_kwargs", "inference_context",
)
# GPTModel._postprocess's parameters (after self) in each supported megatron-core release (0.18-0.19: checked
# by the tests; the model uses the hook there).
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


class PostprocessShim:
    """CPLMGPTModel's base before GPTModel on megatron-core 0.16/0.17: `forward_through_shim` keeps the
    request for the one call, `_postprocess` hands the last stage's hidden states to `head_output`."""

    def forward_through_shim(self, request, input_ids, position_ids, attention_mask, *args: Any, **kwargs: Any):
        self._request = request
        try:
            return GPTModel.forward(self, input_ids, position_ids, attention_mask, *args, **kwargs)
        finally:
            self._request = None

    def _postprocess(self, hidden_states, input_ids, position_ids, labels, *, loss_mask=None,
                     inference_context=None, runtime_gather_output=None, **megatron_args):
        """GPTModel's post-processing with the head on the last stage. Reads hidden_states, input_ids,
        labels, loss_mask, inference_context, runtime_gather_output; the other arguments of the installed
        release (POSTPROCESS_SIGNATURES) go to GPTModel._postprocess untouched when the head is not involved."""
        plain = partial(GPTModel._postprocess, self, hidden_states, input_ids, position_ids, labels,
                        loss_mask=loss_mask, inference_context=inference_context,
                        runtime_gather_output=runtime_gather_output, **megatron_args)
        request = self._request
        if not self.post_process:
            return plain()
        self.refuse_native_inference(inference_context)
        if self.copy_head is None and request.output == "loss" and (labels is None or self.lm_head_loss == "megatron"):
            return plain()
        return self.head_output(hidden_states, input_ids, labels, loss_mask, runtime_gather_output, request)
