"""The Llama family (Llama 2/3 shapes, SmolLM2, Mistral without a sliding window): RMSNorm, SwiGLU, RoPE, no
biases, optional GQA. HF side: LlamaForCausalLM (or CPLMForCausalLM with the copy head, hf/modeling_cplm.py)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cplm_megatron.model.backbones.base import (
    EMBEDDING,
    FC1,
    FC2,
    FINAL_NORM,
    INPUT_NORM,
    MLP_NORM,
    NO_SPECIAL_TOKENS,
    OUTPUT_LAYER,
    PROJ,
    QKV,
    BackboneSpec,
    ConversionError,
    HFState,
    ModelShape,
    checked,
    merge_qkv,
    qkv_rows,
    split_qkv,
    vocab_rows,
)

if TYPE_CHECKING:
    import torch


def rope_of(hf: Any) -> tuple[float, str]:
    """(rope theta, rope type) of an HF config, for transformers 4.x and 5.x alike."""
    params = getattr(hf, "rope_parameters", None) or {}
    scaling = getattr(hf, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(theta if theta is not None else 10000.0), str(rope_type)


class LlamaSpec(BackboneSpec):
    """Llama: the decoder every RoPE/RMSNorm/SwiGLU family here derives from."""

    family = "llama"
    required = {"position_embedding": "rope", "normalization": "RMSNorm", "activation": "swiglu",
                "add_bias_linear": False}
    hf_model_types = ("llama", "mistral")  # and "cplm" with cplm_backbone "llama" (config_mapping)
    cplm_export = True
    # per-layer tensors copied as they are: HF name (under model.layers.{i}.) -> Megatron key
    LAYER_TENSORS = {"input_layernorm.weight": INPUT_NORM + "weight",
                     "post_attention_layernorm.weight": MLP_NORM + "weight"}

    def hf_model_class(self) -> type:
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM

    def hf_config_fields(self, model: ModelShape) -> dict[str, Any]:
        """The HF config's fields (shared with CPLMConfig, which extends LlamaConfig)."""
        return {
            "vocab_size": model.vocab_size,
            "hidden_size": model.hidden_size,
            "intermediate_size": model.ffn_hidden_size,
            "num_hidden_layers": model.num_layers,
            "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.kv_heads,
            "head_dim": model.head_dim,
            "max_position_embeddings": model.max_position_embeddings,
            "rms_norm_eps": model.norm_eps,
            "rope_theta": float(model.rope_theta),
            "tie_word_embeddings": model.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "initializer_range": model.init_method_std,
            **NO_SPECIAL_TOKENS,
        }

    def hf_config(self, model: ModelShape, positions: int | None = None) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(**self.hf_config_fields(model))

    def layer_shapes(self, model: ModelShape) -> dict[str, tuple[int, ...]]:
        """Per-layer shape of each LAYER_TENSORS entry."""
        return {name: (model.hidden_size,) for name in self.LAYER_TENSORS}

    def to_hf(self, tensors: Mapping[str, torch.Tensor], model: ModelShape) -> dict[str, torch.Tensor]:
        n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
        attn_width = model.num_attention_heads * model.head_dim
        state = {"model.embed_tokens.weight": vocab_rows(tensors, EMBEDDING, model),
                 "model.norm.weight": checked(tensors, FINAL_NORM + "weight", (h,))}
        if not model.tie_embeddings:
            state["lm_head.weight"] = vocab_rows(tensors, OUTPUT_LAYER, model)
        copied = {name: checked(tensors, key, (n, *self.layer_shapes(model)[name]))
                  for name, key in self.LAYER_TENSORS.items()}
        qkv = checked(tensors, QKV + "weight", (n, qkv_rows(model), h))
        proj = checked(tensors, PROJ + "weight", (n, h, attn_width))
        fc1 = checked(tensors, FC1 + "weight", (n, 2 * f, h))
        fc2 = checked(tensors, FC2 + "weight", (n, h, f))
        for i in range(n):
            prefix = f"model.layers.{i}."
            q, k, v = split_qkv(qkv[i], model)
            state.update({prefix + name: stacked[i] for name, stacked in copied.items()})
            state.update({
                prefix + "self_attn.q_proj.weight": q,
                prefix + "self_attn.k_proj.weight": k,
                prefix + "self_attn.v_proj.weight": v,
                prefix + "self_attn.o_proj.weight": proj[i],
                prefix + "mlp.gate_proj.weight": fc1[i, :f],
                prefix + "mlp.up_proj.weight": fc1[i, f:],
                prefix + "mlp.down_proj.weight": fc2[i],
            })
        return state

    def from_hf(self, state: HFState, model: ModelShape) -> dict[str, torch.Tensor]:
        import torch

        n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
        kv_width, attn_width = model.kv_heads * model.head_dim, model.num_attention_heads * model.head_dim
        layer = "model.layers.{i}."
        q = state.stacked(layer + "self_attn.q_proj.weight", n, (attn_width, h))
        k = state.stacked(layer + "self_attn.k_proj.weight", n, (kv_width, h))
        v = state.stacked(layer + "self_attn.v_proj.weight", n, (kv_width, h))
        tensors = {key: state.stacked(layer + name, n, self.layer_shapes(model)[name])
                   for name, key in self.LAYER_TENSORS.items()}
        tensors.update({
            EMBEDDING: state.padded_vocab("model.embed_tokens.weight", model),
            QKV + "weight": torch.stack([merge_qkv(q[i], k[i], v[i], model) for i in range(n)]),
            PROJ + "weight": state.stacked(layer + "self_attn.o_proj.weight", n, (h, attn_width)),
            FC1 + "weight": torch.cat([state.stacked(layer + "mlp.gate_proj.weight", n, (f, h)),
                                       state.stacked(layer + "mlp.up_proj.weight", n, (f, h))], dim=1),
            FC2 + "weight": state.stacked(layer + "mlp.down_proj.weight", n, (h, f)),
            FINAL_NORM + "weight": state.take("model.norm.weight", (h,)),
        })
        if model.tie_embeddings:
            state.used.add("lm_head.weight")
        else:
            tensors[OUTPUT_LAYER] = state.padded_vocab("lm_head.weight", model)
        return tensors

    def exact_fields(self, hf: Any) -> dict[str, tuple[Any, Any]]:
        """HF config values the Megatron backbone reproduces only at one value: name -> (value, needed)."""
        return {
            "hidden_act": (getattr(hf, "hidden_act", "silu"), "silu"),
            "attention_bias": (bool(getattr(hf, "attention_bias", False)), False),
            "mlp_bias": (bool(getattr(hf, "mlp_bias", False)), False),
            "rope type": (rope_of(hf)[1], "default"),
        }

    def model_fields(self, hf: Any, source: str) -> dict[str, Any]:
        if getattr(hf, "sliding_window", None) is not None and getattr(hf, "use_sliding_window", True):
            raise ConversionError(
                f"unsupported architecture in {source}: sliding_window={hf.sliding_window}; Megatron here trains "
                "full causal attention, so sliding-window models cannot be converted exactly"
            )
        for name, (value, needed) in self.exact_fields(hf).items():
            if value != needed:
                raise ConversionError(f"unsupported architecture in {source}: {name}={value!r} (only {needed!r} "
                                      f"converts exactly to the Megatron {self.family} backbone)")
        theta = rope_of(hf)[0]
        if theta != int(theta):
            raise ConversionError(f"unsupported architecture in {source}: rope_theta={theta} is not an integer "
                                  "(Megatron's rotary_base is an int)")
        heads, kv_heads = hf.num_attention_heads, getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        return dict(
            family=self.family, num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size,
            num_attention_heads=heads, num_query_groups=kv_heads if kv_heads != heads else None,
            ffn_hidden_size=hf.intermediate_size,
            kv_channels=head_dim if head_dim * heads != hf.hidden_size else None,
            vocab_size=hf.vocab_size, max_position_embeddings=hf.max_position_embeddings,
            position_embedding="rope", rope_theta=theta, normalization="RMSNorm", norm_eps=hf.rms_norm_eps,
            activation="swiglu", add_bias_linear=False, tie_embeddings=bool(hf.tie_word_embeddings),
            init_method_std=getattr(hf, "initializer_range", 0.02),
        )


SPEC = LlamaSpec()
