"""Config mapping between the Megatron side (`ModelConfig`, `CopyHeadConfig`) and Hugging Face configs.

Export: Llama-family backbones become `CPLMConfig` (copy head on) or `LlamaConfig` (off); GPT-2-family
backbones become `GPT2Config`. Import: Llama-family HF configs (llama, mistral without a sliding
window, cplm) become a `ModelConfig`. Anything the other side cannot express exactly is a
`ConversionError` naming the field, never a silent approximation.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from transformers import GPT2Config, LlamaConfig, PretrainedConfig

from cplm_megatron.errors import ConfigError, UserError
from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.model.config import ModelConfig, load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig

log = logging.getLogger(__name__)

IMPORTABLE_MODEL_TYPES = ("llama", "mistral", "cplm")
# Backbone fields a preset must share with the imported HF config (weights or numerics depend on them).
PRESET_FIELDS = (
    "family", "num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size", "head_dim",
    "vocab_size", "position_embedding", "rope_theta", "normalization", "norm_eps", "activation",
    "add_bias_linear", "tie_embeddings",
)
# What each family must look like for an exact HF equivalent: field -> required value.
_LLAMA_BACKBONE = {"position_embedding": "rope", "normalization": "RMSNorm", "activation": "swiglu",
                   "add_bias_linear": False}
_GPT2_BACKBONE = {"position_embedding": "learned_absolute", "normalization": "LayerNorm", "activation": "gelu",
                  "add_bias_linear": True}


# Special token ids come from the tokenizer (write_hf_checkpoint), not from transformers' defaults.
_NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


class ConversionError(UserError):
    """A checkpoint or config that cannot be converted exactly; the message names the field and the fix."""


def check_exportable(model: ModelConfig, copy_head: CopyHeadConfig | None) -> None:
    """Raise unless `model` (+ the copy head) has an exact Hugging Face equivalent."""
    required = {"llama": _LLAMA_BACKBONE, "gpt2": _GPT2_BACKBONE}.get(model.family)
    if required is None:
        raise ConversionError(f"unsupported architecture: model.family={model.family!r} (supported: llama, gpt2)")
    for field, value in required.items():
        if getattr(model, field) != value:
            raise ConversionError(
                f"unsupported architecture: a {model.family}-family model with model.{field}="
                f"{getattr(model, field)!r} has no Hugging Face equivalent (the {model.family} export needs "
                f"model.{field}={value!r})"
            )
    if model.family == "gpt2":
        if copy_head is not None:
            raise ConversionError(
                "unsupported architecture: the Copy-Paste head is exported with the Llama-family "
                "CPLMForCausalLM only; this gpt2-family checkpoint has copy_head.enabled=true"
            )
        if model.kv_heads != model.num_attention_heads:
            raise ConversionError(f"unsupported architecture: GPT2LMHeadModel has no grouped-query attention "
                                  f"(model.num_query_groups={model.kv_heads}, heads={model.num_attention_heads})")
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            raise ConversionError(f"unsupported architecture: GPT2LMHeadModel needs head_dim * heads == hidden_size "
                                  f"(model.kv_channels={model.kv_channels})")


def hf_config_from_megatron(
    model: ModelConfig, copy_head: CopyHeadConfig | None, gpt2_positions: int | None = None
) -> PretrainedConfig:
    """The HF config of a Megatron backbone: CPLMConfig, LlamaConfig or GPT2Config.

    `gpt2_positions`: rows of the learned position table (GPT-2 only; the trainer sizes it to its
    sequence length, so it comes from the saved tensor, not from the config).
    """
    check_exportable(model, copy_head)
    if model.family == "gpt2":
        if gpt2_positions is None:
            raise ValueError("hf_config_from_megatron: a gpt2-family export needs gpt2_positions")
        return GPT2Config(
            vocab_size=model.vocab_size, n_positions=gpt2_positions, n_embd=model.hidden_size,
            n_layer=model.num_layers, n_head=model.num_attention_heads, n_inner=model.ffn_hidden_size,
            activation_function="gelu",  # Megatron uses exact (erf) GELU, not GPT-2's tanh approximation
            layer_norm_epsilon=model.norm_eps, initializer_range=model.init_method_std,
            tie_word_embeddings=model.tie_embeddings,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # trained without dropout
            **_NO_SPECIAL_TOKENS,
        )
    fields: dict[str, Any] = {
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
        **_NO_SPECIAL_TOKENS,
    }
    if copy_head is None:
        return LlamaConfig(**fields)
    return CPLMConfig(
        copy_heads=copy_head.heads, copy_head_dim=copy_head.head_dim, copy_qk_norm=copy_head.qk_norm,
        copy_norm_eps=copy_head.norm_eps, copy_gate_bias_init=copy_head.gate_bias_init,
        copy_mixing=copy_head.mixing, **fields,
    )


def rope_of(hf: PretrainedConfig) -> tuple[float, str]:
    """(rope theta, rope type) of a Llama-family config, for transformers 4.x and 5.x alike."""
    params = getattr(hf, "rope_parameters", None) or {}
    scaling = getattr(hf, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return float(theta if theta is not None else 10000.0), str(rope_type)


def model_config_from_hf(hf: PretrainedConfig, source: str) -> ModelConfig:
    """A Megatron `ModelConfig` equal to a Llama-family HF config; `source` names its file in errors."""
    model_type = getattr(hf, "model_type", None)
    if model_type not in IMPORTABLE_MODEL_TYPES:
        raise ConversionError(
            f"unsupported architecture in {source}: model_type={model_type!r} (architectures "
            f"{getattr(hf, 'architectures', None)}); convert_from_hf reads Llama-family decoders: "
            f"{', '.join(IMPORTABLE_MODEL_TYPES)}"
        )
    if getattr(hf, "sliding_window", None) is not None and getattr(hf, "use_sliding_window", True):
        raise ConversionError(
            f"unsupported architecture in {source}: sliding_window={hf.sliding_window}; Megatron here trains "
            "full causal attention, so sliding-window models cannot be converted exactly"
        )
    theta, rope_type = rope_of(hf)
    exact = {
        "hidden_act": (getattr(hf, "hidden_act", "silu"), "silu"),
        "attention_bias": (bool(getattr(hf, "attention_bias", False)), False),
        "mlp_bias": (bool(getattr(hf, "mlp_bias", False)), False),
        "rope type": (rope_type, "default"),
    }
    for name, (value, needed) in exact.items():
        if value != needed:
            raise ConversionError(f"unsupported architecture in {source}: {name}={value!r} (only {needed!r} "
                                  "converts exactly to the Megatron Llama backbone)")
    if theta != int(theta):
        raise ConversionError(f"unsupported architecture in {source}: rope_theta={theta} is not an integer "
                              "(Megatron's rotary_base is an int)")
    heads, kv_heads = hf.num_attention_heads, getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    model = ModelConfig(
        family="llama", num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size,
        num_attention_heads=heads, num_query_groups=kv_heads if kv_heads != heads else None,
        ffn_hidden_size=hf.intermediate_size,
        kv_channels=head_dim if head_dim * heads != hf.hidden_size else None,
        vocab_size=hf.vocab_size, max_position_embeddings=hf.max_position_embeddings,
        position_embedding="rope", rope_theta=theta, normalization="RMSNorm", norm_eps=hf.rms_norm_eps,
        activation="swiglu", add_bias_linear=False, tie_embeddings=bool(hf.tie_word_embeddings),
        init_method_std=getattr(hf, "initializer_range", 0.02),
    )
    try:
        model.validate()
    except ConfigError as err:
        raise ConversionError(f"{source}: {err}") from err
    return model


def copy_head_config_from_hf(
    hf: PretrainedConfig, enabled: bool, heads: int | None = None, head_dim: int | None = None
) -> CopyHeadConfig:
    """The copy-head section for an import: the HF CPLM head's shape, else defaults/`heads`/`head_dim`.

    An HF CPLM's trained head has fixed shapes, so `heads`/`head_dim` must agree with it.
    """
    config = CopyHeadConfig(enabled=enabled)
    if getattr(hf, "model_type", None) == "cplm":
        config = dataclasses.replace(
            config, heads=hf.copy_heads, head_dim=hf.copy_head_dim, qk_norm=hf.copy_qk_norm,
            norm_eps=hf.copy_norm_eps, gate_bias_init=hf.copy_gate_bias_init,
            mixing=getattr(hf, "copy_mixing", "gate"),
        )
        for name, given, saved in (("copy heads", heads, hf.copy_heads), ("copy head dim", head_dim, hf.copy_head_dim)):
            if enabled and given is not None and given != saved:
                raise ConversionError(f"--{name.replace(' ', '-')} {given} differs from the HF CPLM checkpoint's "
                                      f"trained copy head ({name} = {saved}); drop the option to keep the trained head")
        return config
    overrides = {name: value for name, value in (("heads", heads), ("head_dim", head_dim)) if value is not None}
    config = dataclasses.replace(config, **overrides)
    try:
        config.validate()
    except ConfigError as err:
        raise ConversionError(str(err)) from err
    return config


def check_preset_matches(preset: str, derived: ModelConfig, source: str) -> ModelConfig:
    """The preset's `ModelConfig`, after checking it has the shapes and numerics of `derived`.

    A mismatch in any PRESET_FIELDS is an error naming the field and both values. A different
    max_position_embeddings only warns: RoPE has no weights, so it does not change the checkpoint.
    """
    try:
        target = load_preset(preset)
    except ConfigError as err:
        raise ConversionError(f"--preset: {err}") from err
    mismatches = [
        f"{field}: preset {preset} has {getattr(target, field)!r}, {source} has {getattr(derived, field)!r}"
        for field in PRESET_FIELDS
        if getattr(target, field) != getattr(derived, field)
    ]
    if mismatches:
        raise ConversionError(f"--preset {preset} does not match the HF checkpoint: " + "; ".join(mismatches)
                              + " (drop --preset to take every field from the HF config)")
    if target.max_position_embeddings != derived.max_position_embeddings:
        log.warning("preset %s has max_position_embeddings=%d, %s has %d; training from the converted checkpoint "
                    "with the preset uses %d", preset, target.max_position_embeddings, source,
                    derived.max_position_embeddings, target.max_position_embeddings)
    return target
