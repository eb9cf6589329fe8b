"""Config mapping between the Megatron side (`ModelConfig`, `CopyHeadConfig`) and Hugging Face configs.

Each family's own mapping is its backbone spec's (cplm_megatron/model/backbones/): export gives its HF config
(LlamaConfig, GPT2Config, Qwen3Config), or `CPLMConfig` when the copy head is on (its `cplm_backbone` the family's
HF model_type: llama, qwen3); import reads the HF `model_type`s a family declares (llama, mistral without a sliding
window, qwen3), and cplm as the family of its `cplm_backbone`. Anything the other side cannot express exactly is
a `ConversionError` naming the field, never a silent approximation.
"""

from __future__ import annotations

import dataclasses
import logging

from transformers import PretrainedConfig

from cplm_megatron.errors import ConfigError
from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.model.backbones import backbone, importable_model_types, importer, registry
from cplm_megatron.model.backbones.base import ConversionError
from cplm_megatron.model.backbones.llama import rope_of  # noqa: F401 - re-exported
from cplm_megatron.model.config import ModelConfig, load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig

log = logging.getLogger(__name__)

IMPORTABLE_MODEL_TYPES = (*importable_model_types(), CPLMConfig.model_type)
# Backbone fields a preset must share with the imported HF config (weights or numerics depend on them).
PRESET_FIELDS = (
    "family", "num_layers", "hidden_size", "num_attention_heads", "kv_heads", "ffn_hidden_size", "head_dim",
    "vocab_size", "position_embedding", "rope_theta", "normalization", "norm_eps", "activation",
    "add_bias_linear", "tie_embeddings",
)


def check_exportable(model: ModelConfig, copy_head: CopyHeadConfig | None) -> None:
    """Raise unless `model` (+ the copy head) has an exact Hugging Face equivalent."""
    try:
        spec = backbone(model.family)
    except ConfigError as err:
        raise ConversionError(f"unsupported architecture: {err}") from err
    spec.check_exportable(model)
    if copy_head is not None and not spec.cplm_export:
        families = ", ".join(sorted(name for name, other in registry().items() if other.cplm_export))
        raise ConversionError(
            f"unsupported architecture: the Copy-Paste head is exported (CPLMForCausalLM) with the {families} "
            f"families; this {model.family}-family checkpoint has copy_head.enabled=true"
        )


def hf_config_from_megatron(
    model: ModelConfig, copy_head: CopyHeadConfig | None, gpt2_positions: int | None = None
) -> PretrainedConfig:
    """The HF config of a Megatron backbone: its family's (LlamaConfig, GPT2Config, Qwen3Config), or CPLMConfig.

    `gpt2_positions`: rows of the learned position table (GPT-2 only; the trainer sizes it to its
    sequence length, so it comes from the saved tensor, not from the config).
    """
    check_exportable(model, copy_head)
    spec = backbone(model.family)
    if copy_head is None:
        return spec.hf_config(model, gpt2_positions)
    return CPLMConfig(
        copy_heads=copy_head.heads, copy_head_dim=copy_head.head_dim, copy_qk_norm=copy_head.qk_norm,
        copy_norm_eps=copy_head.norm_eps, copy_gate_bias_init=copy_head.gate_bias_init,
        copy_mixing=copy_head.mixing, cplm_backbone=spec.hf_model_type(), **spec.hf_config_fields(model),
    )


def model_config_from_hf(hf: PretrainedConfig, source: str) -> ModelConfig:
    """A Megatron `ModelConfig` equal to an HF config some family imports; `source` names its file in errors."""
    model_type = getattr(hf, "model_type", None)
    if model_type == CPLMConfig.model_type:
        model_type = getattr(hf, "cplm_backbone", "llama")  # exports before cplm_backbone existed were Llama's
    spec = importer(model_type)
    if spec is None:
        raise ConversionError(
            f"unsupported architecture in {source}: model_type={model_type!r} (architectures "
            f"{getattr(hf, 'architectures', None)}); convert_from_hf reads decoders of model types: "
            f"{', '.join(IMPORTABLE_MODEL_TYPES)}"
        )
    model = ModelConfig(**spec.model_fields(hf, source))
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
