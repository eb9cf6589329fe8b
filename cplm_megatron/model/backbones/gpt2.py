"""The GPT-2 family: LayerNorm, exact-GELU MLP, learned absolute positions, biases, multi-head attention.
HF side: GPT2LMHeadModel (Conv1D weights are [in, out]); export only, without the copy head."""
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
    POSITIONS,
    PROJ,
    QKV,
    BackboneSpec,
    ConversionError,
    ModelShape,
    checked,
    split_qkv,
    vocab_rows,
)

if TYPE_CHECKING:
    import torch


class GPT2Spec(BackboneSpec):
    """GPT-2 as Megatron builds it (GELU without the tanh approximation)."""

    family = "gpt2"
    required = {"position_embedding": "learned_absolute", "normalization": "LayerNorm", "activation": "gelu",
                "add_bias_linear": True}

    def check_exportable(self, model: ModelShape) -> None:
        super().check_exportable(model)
        if model.kv_heads != model.num_attention_heads:
            raise ConversionError(f"unsupported architecture: GPT2LMHeadModel has no grouped-query attention "
                                  f"(model.num_query_groups={model.kv_heads}, heads={model.num_attention_heads})")
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            raise ConversionError(f"unsupported architecture: GPT2LMHeadModel needs head_dim * heads == hidden_size "
                                  f"(model.kv_channels={model.kv_channels})")

    def hf_model_class(self) -> type:
        from transformers import GPT2LMHeadModel

        return GPT2LMHeadModel

    def hf_config(self, model: ModelShape, positions: int | None = None) -> Any:
        """GPT2Config; `positions`: rows of the learned position table (the trainer sizes it to its sequence
        length, so it comes from the saved tensor, not from the config)."""
        from transformers import GPT2Config

        if positions is None:
            raise ValueError("hf_config_from_megatron: a gpt2-family export needs gpt2_positions")
        return GPT2Config(
            vocab_size=model.vocab_size, n_positions=positions, n_embd=model.hidden_size,
            n_layer=model.num_layers, n_head=model.num_attention_heads, n_inner=model.ffn_hidden_size,
            activation_function="gelu",  # Megatron uses exact (erf) GELU, not GPT-2's tanh approximation
            layer_norm_epsilon=model.norm_eps, initializer_range=model.init_method_std,
            tie_word_embeddings=model.tie_embeddings,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # trained without dropout
            **NO_SPECIAL_TOKENS,
        )

    def to_hf(self, tensors: Mapping[str, torch.Tensor], model: ModelShape) -> dict[str, torch.Tensor]:
        import torch

        n, h, f = model.num_layers, model.hidden_size, model.ffn_hidden_size
        state = {"transformer.wte.weight": vocab_rows(tensors, EMBEDDING, model),
                 "transformer.wpe.weight": checked(tensors, POSITIONS, (None, h)),
                 "transformer.ln_f.weight": checked(tensors, FINAL_NORM + "weight", (h,)),
                 "transformer.ln_f.bias": checked(tensors, FINAL_NORM + "bias", (h,))}
        if not model.tie_embeddings:
            state["lm_head.weight"] = vocab_rows(tensors, OUTPUT_LAYER, model)
        layer = {
            "ln_1.weight": checked(tensors, INPUT_NORM + "weight", (n, h)),
            "ln_1.bias": checked(tensors, INPUT_NORM + "bias", (n, h)),
            "ln_2.weight": checked(tensors, MLP_NORM + "weight", (n, h)),
            "ln_2.bias": checked(tensors, MLP_NORM + "bias", (n, h)),
            # Conv1D stores [in, out]: transpose every linear weight
            "attn.c_proj.weight": checked(tensors, PROJ + "weight", (n, h, h)).transpose(1, 2),
            "attn.c_proj.bias": checked(tensors, PROJ + "bias", (n, h)),
            "mlp.c_fc.weight": checked(tensors, FC1 + "weight", (n, f, h)).transpose(1, 2),
            "mlp.c_fc.bias": checked(tensors, FC1 + "bias", (n, f)),
            "mlp.c_proj.weight": checked(tensors, FC2 + "weight", (n, h, f)).transpose(1, 2),
            "mlp.c_proj.bias": checked(tensors, FC2 + "bias", (n, h)),
        }
        qkv_weight = checked(tensors, QKV + "weight", (n, 3 * h, h))
        qkv_bias = checked(tensors, QKV + "bias", (n, 3 * h))
        for i in range(n):
            prefix = f"transformer.h.{i}."
            state.update({prefix + name: stacked[i] for name, stacked in layer.items()})
            # Megatron groups [q_j; k_j; v_j] per head j; HF's c_attn output is [q; k; v] over all heads.
            state[prefix + "attn.c_attn.weight"] = torch.cat(split_qkv(qkv_weight[i], model)).t()
            state[prefix + "attn.c_attn.bias"] = torch.cat(split_qkv(qkv_bias[i], model))
        return state


SPEC = GPT2Spec()
