"""`BackboneSpec`: what a backbone family is, in one object (Megatron-Core build, accounting facts, HF adapter).

A family's module in this package subclasses it and defines `SPEC`; the registry (`backbones/__init__.py`)
finds it. The shared pieces live here: the Megatron tensor keys of a torch_dist checkpoint (transformer
layers stacked on dim 0, layout-independent), shape checks, and the grouped QKV layout.

Megatron side: `linear_qkv.weight` [(H + 2G)·d, h] is grouped per query group g: [the H/G query heads of g;
k_g; v_g]; a gated MLP's `linear_fc1.weight` is [gate; up] over the full ffn width; the embedding and output
layer have `padded_vocab_size` rows (padded rows dropped on export, zero-filled on import). Nothing here
imports torch, transformers or megatron-core at import time (the GPU check's summary step counts parameters
without torch).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from cplm_megatron.errors import UserError

if TYPE_CHECKING:
    import torch


class ModelShape(Protocol):
    """What a backbone reads of a model's config (cplm_megatron.model.config.ModelConfig has it all): the
    backbones depend on this shape, not on the config module, which imports the registry."""

    family: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None
    kv_channels: int | None
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    position_embedding: str
    rope_theta: float
    normalization: str
    norm_eps: float
    add_bias_linear: bool
    tie_embeddings: bool
    init_method_std: float

    @property
    def head_dim(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def padded_vocab_size(self) -> int: ...

EMBEDDING = "embedding.word_embeddings.weight"
POSITIONS = "embedding.position_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm."
INPUT_NORM = "decoder.layers.self_attention.linear_qkv.layer_norm_"
QKV = "decoder.layers.self_attention.linear_qkv."
Q_NORM = "decoder.layers.self_attention.q_layernorm."
K_NORM = "decoder.layers.self_attention.k_layernorm."
PROJ = "decoder.layers.self_attention.linear_proj."
MLP_NORM = "decoder.layers.mlp.linear_fc1.layer_norm_"
FC1 = "decoder.layers.mlp.linear_fc1."
FC2 = "decoder.layers.mlp.linear_fc2."

# HF tensors that carry no weights (non-persistent buffers saved by old transformers versions).
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)
# Special token ids come from the tokenizer (write_hf_checkpoint), not from transformers' defaults.
NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


class ConversionError(UserError):
    """A checkpoint or config that cannot be converted exactly; the message names the field and the fix."""


def checked(tensors: Mapping[str, torch.Tensor], key: str, shape: tuple[int | None, ...]) -> torch.Tensor:
    """tensors[key], which must have `shape` (None: any size); errors name the key and both shapes."""
    if key not in tensors:
        raise ConversionError(f"missing tensor {key}")
    tensor = tensors[key]
    if tensor.dim() != len(shape) or any(want is not None and got != want for got, want in zip(tensor.shape, shape)):
        wanted = ["*" if s is None else s for s in shape]
        raise ConversionError(f"{key} has shape {list(tensor.shape)} but the config implies {wanted}")
    return tensor


def qkv_rows(model: ModelShape) -> int:
    """Rows of Megatron's fused QKV weight."""
    return (model.num_attention_heads + 2 * model.kv_heads) * model.head_dim


def split_qkv(qkv: torch.Tensor, model: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Grouped Megatron QKV rows [(H + 2G)·d, ...] -> q [H·d, ...], k [G·d, ...], v [G·d, ...]."""
    groups, per_group, d = model.kv_heads, model.num_attention_heads // model.kv_heads, model.head_dim
    grouped = qkv.reshape(groups, per_group + 2, d, *qkv.shape[1:])
    rest = qkv.shape[1:]
    return (grouped[:, :per_group].reshape(groups * per_group * d, *rest),
            grouped[:, per_group].reshape(groups * d, *rest),
            grouped[:, per_group + 1].reshape(groups * d, *rest))


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, model: ModelShape) -> torch.Tensor:
    """Inverse of `split_qkv`."""
    import torch

    groups, per_group, d = model.kv_heads, model.num_attention_heads // model.kv_heads, model.head_dim
    rest = q.shape[1:]
    grouped = torch.cat([q.reshape(groups, per_group, d, *rest), k.reshape(groups, 1, d, *rest),
                         v.reshape(groups, 1, d, *rest)], dim=1)
    return grouped.reshape(qkv_rows(model), *rest)


def vocab_rows(tensors: Mapping[str, torch.Tensor], key: str, model: ModelShape) -> torch.Tensor:
    """The real-vocabulary rows of a padded embedding / output layer."""
    return checked(tensors, key, (model.padded_vocab_size, model.hidden_size))[: model.vocab_size]


class HFState:
    """An HF state dict read once per tensor: `take` checks shapes and records use, `unused` lists the rest."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state = state
        self.used: set[str] = set()

    def take(self, key: str, shape: tuple[int | None, ...]) -> torch.Tensor:
        """state[key] with `shape`, marked used."""
        self.used.add(key)
        return checked(self.state, key, shape)

    def stacked(self, name: str, layers: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Per-layer tensors `{prefix}{i}.{name}` stacked on dim 0 (`name` holds `{i}`)."""
        import torch

        return torch.stack([self.take(name.format(i=i), shape) for i in range(layers)])

    def padded_vocab(self, key: str, model: ModelShape) -> torch.Tensor:
        """A [vocab, h] HF table zero-filled to Megatron's padded vocabulary."""
        import torch

        rows = self.take(key, (model.vocab_size, model.hidden_size))
        return torch.cat([rows, rows.new_zeros(model.padded_vocab_size - model.vocab_size, model.hidden_size)])

    def unused(self) -> list[str]:
        """Keys never taken (weightless buffers aside)."""
        return sorted(k for k in self.state if k not in self.used and not k.endswith(IGNORED_HF_SUFFIXES))


class BackboneSpec:
    """One backbone family: the preset fields it fixes, its Megatron-Core layer spec and TransformerConfig
    extras, its accounting facts and its Hugging Face adapter (config and weights both ways)."""

    family: str = ""
    # preset fields the family fixes (what its HF model class computes): field -> required value
    required: Mapping[str, Any] = {}
    qk_norm: bool = False  # RMSNorm of each query/key head before RoPE (head_dim weights per layer, twice)
    hf_model_types: tuple[str, ...] = ()  # HF `model_type`s convert_from_hf reads as this family
    # whether the copy head exports with this backbone: CPLMForCausalLM (hf/modeling_cplm.py) builds the decoder of
    # the HF class's model_type from a Llama-style config (CPLMConfig) that holds the family's own fields
    cplm_export: bool = False

    # ---------------------------------------------------------------- Megatron-Core
    def transformer_config_kwargs(self, model: ModelShape) -> dict[str, Any]:
        """TransformerConfig arguments this family sets beyond the shared shape fields."""
        return {"qk_layernorm": self.qk_norm}

    def layer_spec(self, model: ModelShape, use_te: bool) -> Any:
        """Megatron-Core's transformer layer spec (TE's on GPUs with transformer_engine, local otherwise)."""
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_local_spec,
            get_gpt_layer_with_transformer_engine_spec,
        )

        if use_te:
            return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=self.qk_norm)
        return get_gpt_layer_local_spec(qk_layernorm=self.qk_norm, normalization=model.normalization)

    # ---------------------------------------------------------------- accounting
    def layer_norm_params(self, model: ModelShape) -> int:
        """Normalization parameters of one transformer layer (input, pre-MLP and any q/k norms)."""
        per_norm = model.hidden_size * (2 if model.normalization == "LayerNorm" else 1)
        return 2 * per_norm + (2 * model.head_dim if self.qk_norm else 0)

    # ---------------------------------------------------------------- checkpoint keys
    def megatron_keys(self, model: ModelShape) -> list[str]:
        """The Megatron tensors a checkpoint of this backbone holds (copy head and optimizer aside)."""
        suffixes = ["weight", "bias"] if model.normalization == "LayerNorm" else ["weight"]
        linear = ["weight", "bias"] if model.add_bias_linear else ["weight"]
        keys = [EMBEDDING]
        if model.position_embedding == "learned_absolute":
            keys.append(POSITIONS)
        keys += [prefix + s for prefix in (INPUT_NORM, MLP_NORM, FINAL_NORM) for s in suffixes]
        keys += [prefix + s for prefix in (QKV, PROJ, FC1, FC2) for s in linear]
        if self.qk_norm:
            keys += [Q_NORM + "weight", K_NORM + "weight"]
        if not model.tie_embeddings:
            keys.append(OUTPUT_LAYER)
        return keys

    # ---------------------------------------------------------------- Hugging Face
    def check_exportable(self, model: ModelShape) -> None:
        """Raise unless the backbone has an exact HF equivalent (every `required` field at its value)."""
        for field, value in self.required.items():
            if getattr(model, field) != value:
                raise ConversionError(
                    f"unsupported architecture: a {self.family}-family model with model.{field}="
                    f"{getattr(model, field)!r} has no Hugging Face equivalent (the {self.family} export needs "
                    f"model.{field}={value!r})"
                )

    def hf_model_class(self) -> type:
        """The transformers class an export without the copy head loads as."""
        raise NotImplementedError

    def hf_model_type(self) -> str:
        """The transformers `model_type` of `hf_model_class` (a CPLM export's `cplm_backbone`)."""
        return self.hf_model_class().config_class.model_type

    def hf_config_fields(self, model: ModelShape) -> dict[str, Any]:
        """The HF config's fields as keyword arguments (a CPLM export's CPLMConfig takes them: `cplm_export`)."""
        raise NotImplementedError

    def hf_config(self, model: ModelShape, positions: int | None = None) -> Any:
        """The HF config of the backbone (`positions`: rows of a learned position table, if any)."""
        raise NotImplementedError

    def to_hf(self, tensors: Mapping[str, torch.Tensor], model: ModelShape) -> dict[str, torch.Tensor]:
        """HF state dict of a checkpoint's full Megatron tensors (backbone only)."""
        raise NotImplementedError

    def from_hf(self, state: HFState, model: ModelShape) -> dict[str, torch.Tensor]:
        """Full Megatron tensors of an HF state dict (backbone only); tensors read are marked used."""
        raise ConversionError(f"convert_from_hf does not import the {self.family} family")

    def model_fields(self, hf: Any, source: str) -> dict[str, Any]:
        """The ModelConfig fields equal to an HF config of one of `hf_model_types`; `source` names it in errors."""
        raise ConversionError(f"convert_from_hf does not import the {self.family} family")

