"""The Qwen3 family (dense Qwen3-0.6B ... -32B shapes): the Llama decoder plus an RMSNorm over each query and key
head before RoPE (qk-norm), GQA, head_dim independent of hidden/heads, RoPE base 1e6, tied or untied embeddings.
HF side: Qwen3ForCausalLM, both ways; with the copy head CPLMForCausalLM over Qwen3Model (cplm_backbone: qwen3).

Megatron-Core builds qk-norm with `qk_layernorm=True` (SelfAttention normalizes q/k per head over head_dim, as
HF's `q_norm`/`k_norm`, before rotary), and with tensor parallelism sums their gradients over the TP group
(finalize_model_grads) since each rank sees a subset of the heads."""
from __future__ import annotations

from typing import Any

from cplm_megatron.model.backbones.base import K_NORM, Q_NORM, ModelShape
from cplm_megatron.model.backbones.llama import LlamaSpec


class Qwen3Spec(LlamaSpec):
    """Qwen3: LlamaSpec + per-head q/k RMSNorm (HF `self_attn.q_norm` / `k_norm`, eps = rms_norm_eps)."""

    family = "qwen3"
    qk_norm = True
    hf_model_types = ("qwen3",)
    LAYER_TENSORS = {**LlamaSpec.LAYER_TENSORS,
                     "self_attn.q_norm.weight": Q_NORM + "weight",
                     "self_attn.k_norm.weight": K_NORM + "weight"}

    def hf_model_class(self) -> type:
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM

    def layer_shapes(self, model: ModelShape) -> dict[str, tuple[int, ...]]:
        shapes = super().layer_shapes(model)
        shapes.update({"self_attn.q_norm.weight": (model.head_dim,), "self_attn.k_norm.weight": (model.head_dim,)})
        return shapes

    def hf_config_fields(self, model: ModelShape) -> dict[str, Any]:
        fields = super().hf_config_fields(model)
        del fields["mlp_bias"]  # Qwen3's MLP has no bias option
        return {**fields, "use_sliding_window": False}

    def hf_config(self, model: ModelShape, positions: int | None = None) -> Any:
        from transformers import Qwen3Config

        return Qwen3Config(**self.hf_config_fields(model))

    def exact_fields(self, hf: Any) -> dict[str, tuple[Any, Any]]:
        fields = {name: value for name, value in super().exact_fields(hf).items() if name != "mlp_bias"}
        layer_types = set(getattr(hf, "layer_types", None) or ["full_attention"])
        return {**fields, "layer_types": (sorted(layer_types), ["full_attention"])}


SPEC = Qwen3Spec()
