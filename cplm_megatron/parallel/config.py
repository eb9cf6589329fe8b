"""The `parallel.*` config section and the layout checks that need no process group.

`validate_layout` runs before any rendezvous: a layout that does not fit the world size or the model
fails at once, naming the keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from cplm_megatron.errors import ConfigError

if TYPE_CHECKING:  # type-only: the model package imports this one
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.copy_head import CopyHeadConfig


@dataclass
class ParallelConfig:
    """The `parallel.*` section: model-parallel sizes; data parallelism is what remains."""

    tp: int = 1
    pp: int = 1
    vpp: Optional[int] = None  # virtual pipeline stages (model chunks) per pipeline rank
    sp: bool = False
    cp: int = 1
    backend: str = "auto"  # auto | nccl | gloo
    timeout_minutes: int = 30

    def validate(self) -> None:
        for name in ("tp", "pp", "cp", "timeout_minutes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.vpp is not None and (self.vpp < 1 or self.pp < 2):
            raise ConfigError(f"parallel.vpp={self.vpp} needs parallel.pp >= 2 (got pp={self.pp}) and vpp >= 1")
        if self.sp and self.tp < 2:
            raise ConfigError("parallel.sp=true needs parallel.tp >= 2 (sequence parallelism shards over TP)")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ConfigError(f"parallel.backend must be auto|nccl|gloo, got {self.backend!r}")


def validate_layout(world_size: int, parallel: ParallelConfig, model: ModelConfig) -> int:
    """Check the layout against the world and the model; returns the data-parallel size."""
    parallel.validate()
    mp = parallel.tp * parallel.pp * parallel.cp
    if world_size % mp:
        raise ConfigError(
            f"world size {world_size} is not divisible by parallel.tp*parallel.pp*parallel.cp = "
            f"{parallel.tp}*{parallel.pp}*{parallel.cp} = {mp}; change the layout or the number of processes"
        )
    if model.num_attention_heads % parallel.tp:
        raise ConfigError(
            f"model.num_attention_heads={model.num_attention_heads} is not divisible by "
            f"parallel.tp={parallel.tp}"
        )
    if model.kv_heads % parallel.tp:
        raise ConfigError(
            f"KV heads (model.num_query_groups={model.kv_heads}) are not divisible by parallel.tp={parallel.tp}"
        )
    stages = parallel.pp * (parallel.vpp or 1)
    if model.num_layers % stages:
        raise ConfigError(
            f"model.num_layers={model.num_layers} is not divisible by parallel.pp={parallel.pp}"
            + (f" x parallel.vpp={parallel.vpp}" if parallel.vpp else "")
        )
    if model.padded_vocab_size % parallel.tp:
        raise ConfigError(
            f"padded vocab {model.padded_vocab_size} (model.vocab_size={model.vocab_size}, "
            f"model.vocab_pad_multiple={model.vocab_pad_multiple}) is not divisible by parallel.tp={parallel.tp}"
        )
    return world_size // mp


def check_context_parallel(parallel: ParallelConfig, model: ModelConfig, seq_len: int,
                           copy_head: Optional[CopyHeadConfig] = None) -> None:
    """The context-parallel checks that need no process group: the load-balanced split cuts the sequence
    into 2 x parallel.cp chunks, and only SDPA's (or TE's) core attention and the torch copy kernels
    attend across CP ranks."""
    cp = parallel.cp
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise ConfigError(
            f"train.seq_len={seq_len} is not divisible by 2 x parallel.cp = {2 * cp} (context parallelism "
            f"splits the sequence into 2 x cp chunks); choose a seq_len that is a multiple of {2 * cp}"
        )
    if model.attention_impl == "megatron":
        raise ConfigError(
            f"parallel.cp={cp} needs model.attention_impl=sdpa (or te with Transformer Engine): megatron-core's "
            "unfused DotProductAttention has no context parallelism"
        )
    if copy_head is not None and copy_head.enabled and (copy_head.impl == "fused" or copy_head.fp8):
        raise ConfigError(
            f"parallel.cp={cp}: the fused copy kernel (copy_head.impl=fused, copy_head.fp8) takes no global key "
            "positions yet; use copy_head.impl=chunked (or auto, which picks it under CP) and copy_head.fp8=false"
        )
