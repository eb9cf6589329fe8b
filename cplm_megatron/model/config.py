"""The model's config sections, importable without torch, megatron-core or Triton: `model.*` (the backbone's shape
and recipe, with the named presets in configs/models/, installed as `cplm_megatron.recipes`' package data),
`copy_head.*`, `precision.*` and `recompute.*`. Their checks read the values only; what depends on the machine (CUDA,
Transformer Engine, the copy kernel's head dims) is checked where the model is built (builder.py, copy_head.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

from cplm_megatron.config.loader import (  # noqa: F401 - the presets' readers re-exported: they live with the loader
    PRESET_DIR,
    available_presets,
    build_dataclass,
    preset_dict,
    resolve_model_section,
)
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.backbones import backbone

if TYPE_CHECKING:
    import torch


@dataclass
class ModelConfig:
    """A GPT backbone as Megatron-Core builds it; `family` names its spec (cplm_megatron/model/backbones/)."""

    preset: str = ""
    family: str = "llama"  # a registered backbone: gpt2, llama, qwen3
    num_layers: int = 4
    hidden_size: int = 128
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None  # KV heads; None = multi-head attention
    ffn_hidden_size: int = 384
    kv_channels: Optional[int] = None  # head dim; None = hidden_size / num_attention_heads
    vocab_size: int = 4096
    vocab_pad_multiple: int = 128  # padded vocab is layout-independent, so checkpoints reshard
    max_position_embeddings: int = 2048
    position_embedding: Literal["rope", "learned_absolute"] = "rope"
    rope_theta: float = 10000.0
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    norm_eps: float = 1e-5
    activation: Literal["swiglu", "gelu"] = "swiglu"
    add_bias_linear: bool = False
    tie_embeddings: bool = True
    init_method_std: float = 0.02
    layer_spec: Literal["auto", "local", "te"] = "auto"
    # Core attention: auto = TE's with the TE layer spec, else SDPA (flash / memory-efficient kernels);
    # megatron = megatron-core's unfused DotProductAttention ([b, heads, s, s] scores; kept for comparison).
    attention_impl: Literal["auto", "sdpa", "megatron", "te"] = "auto"
    # The LM head's cross entropy: Megatron's logits tensor, or computed over tiles without one
    # (cplm_megatron/model/lm_head_loss.py; chunked: torch, fused: Triton on GPUs). Same values. auto: Megatron's
    # unless its logits would take > 25% of the device's memory (model/lm_head_choice.py), resolved at launch.
    lm_head_loss: Literal["auto", "megatron", "chunked", "fused"] = "megatron"
    # torch.compile of each transformer layer (model/compile.py): RoPE, SwiGLU, norms, residual adds and casts fused
    # by inductor; the embedding, LM head, copy head and optimizer stay eager. TP = CP = 1, no recomputation.
    compile: bool = False  # torch.compile each transformer layer (fuses RoPE, SwiGLU, norms, casts); TP = CP = 1, no recompute
    # megatron-core's fused SwiGLU (bias_swiglu_impl, torch.compile'd by megatron-core itself): two kernels instead
    # of five per layer and only the fc1 output kept for the backward. Independent of model.compile.
    fused_swiglu: bool = False  # megatron-core's fused SwiGLU: fewer kernels, one activation less kept
    default_tp: int = 1  # suggested layout for 8-GPU nodes (model_info, SLURM scripts)
    default_pp: int = 1

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return ((self.vocab_size + m - 1) // m) * m

    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"

    @property
    def qk_norm(self) -> bool:
        """Whether the family normalizes each query/key head (Qwen3)."""
        return backbone(self.family).qk_norm

    def validate(self) -> None:
        """Shape checks that do not depend on the parallel layout."""
        backbone(self.family)  # an unknown family: one line naming the known ones
        positive = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by "
                f"model.num_attention_heads={self.num_attention_heads}; set model.kv_channels"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ConfigError(
                f"model.num_attention_heads={self.num_attention_heads} is not divisible by "
                f"model.num_query_groups={self.kv_heads}"
            )
        if self.attention_impl == "te" and self.layer_spec == "local":
            raise ConfigError("model.attention_impl=te needs the Transformer Engine layer spec; "
                              "use model.layer_spec=te (or auto) or model.attention_impl=sdpa")
        if self.fused_swiglu and self.activation != "swiglu":
            raise ConfigError(f"model.fused_swiglu=true fuses SwiGLU, but model.activation={self.activation}; "
                              "set model.fused_swiglu=false")
        if self.vocab_pad_multiple <= 0:
            raise ConfigError(f"model.vocab_pad_multiple must be positive, got {self.vocab_pad_multiple}")


# The names of the mixing rules (model/mixing.py's MIXING_RULES, which imports torch), for the config's check
MIXING_VARIANTS = ("gate", "constant", "sentinel")


@dataclass
class CopyHeadConfig:
    """The `copy_head.*` section."""

    enabled: bool = True
    heads: int = 4
    head_dim: int = 64
    qk_norm: bool = False
    norm_eps: float = 1e-5
    gate_bias_init: float = -2.0
    # a variant of cplm_megatron/model/mixing.py: gate (g = sigmoid(w.h + b)), constant (g = sigmoid(b)),
    # sentinel (g = mean_c sigmoid(lse_c - w_c.h - b_c): a pointer sentinel per copy head)
    mixing: str = "gate"
    lm_loss_weight: float = 0.0  # auxiliary LM-only cross entropy
    # true: the mixture loss treats log p_LM as a constant, so the LM head (and the backbone through it)
    # learns from its own cross entropy (lm_loss_weight) exactly as a baseline does; the mixture trains
    # the gate and the copy head. Addresses the LM head starving where the copy head explains the token.
    decouple_lm: bool = False
    copy_loss_weight: float = 0.0  # auxiliary copy-only NLL on positions with a matching candidate
    impl: Literal["auto", "naive", "chunked", "fused"] = "auto"
    block_size: int = 128  # query block of the chunked implementation
    fp8: bool = False  # fused impl only: quantize q/k to float8_e4m3fn (current amax scaling)

    def validate(self) -> None:
        if self.heads < 1 or self.head_dim < 1:
            raise ConfigError(f"copy_head.heads/head_dim must be >= 1, got {self.heads}/{self.head_dim}")
        if self.block_size < 1:
            raise ConfigError(f"copy_head.block_size must be >= 1, got {self.block_size}")
        if self.lm_loss_weight < 0 or self.copy_loss_weight < 0:
            raise ConfigError("copy_head.lm_loss_weight and copy_head.copy_loss_weight must be >= 0")
        if self.decouple_lm and self.lm_loss_weight <= 0:
            raise ConfigError("copy_head.decouple_lm=true trains the LM head only through its own cross entropy: "
                              "set copy_head.lm_loss_weight > 0 (e.g. 1)")
        if self.mixing not in MIXING_VARIANTS:
            raise ConfigError(f"copy_head.mixing={self.mixing!r} is not one of {sorted(MIXING_VARIANTS)} "
                              "(the variants of cplm_megatron/model/mixing.py)")
        if self.fp8 and self.impl not in ("fused", "auto"):
            raise ConfigError(f"copy_head.fp8=true needs copy_head.impl=fused (got {self.impl!r})")


@dataclass
class PrecisionConfig:
    """The `precision.*` section: parameter/compute dtype and FP8 (Transformer Engine only)."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    fp8: Optional[Literal["hybrid", "e4m3"]] = None
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "tensorwise"
    fp8_amax_history_len: int = 1024
    fp8_amax_compute_algo: Literal["max", "most_recent"] = "max"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as torch names it (imports torch: for the builders)."""
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.dtype]

    def validate(self) -> None:
        if self.fp8 and self.dtype == "fp32":
            raise ConfigError("precision.fp8 needs precision.dtype=bf16 (FP8 GEMMs run inside bf16 training)")


@dataclass
class RecomputeConfig:
    """The `recompute.*` section: activation recomputation (Megatron's granularity/method)."""

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] = "uniform"
    num_layers: int = 1


def load_preset(name: str, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a named preset plus keyword overrides."""
    return build_dataclass(ModelConfig, resolve_model_section({"preset": name, **overrides}), "model")
