"""Tile sizes and launch parameters of the fused kernels, per kernel, head width and dtype (a table).

A table rather than ``triton.autotune``: no benchmarking at first call (the GPU benchmark and the
training job start fast and reproducibly). Tiles follow the Triton FlashAttention tutorial's Hopper
shapes (query tile 128 x key tile 64 in forward and dQ; key tile 128 x query tile 64 in dK); warp
counts were chosen so that sm_90 builds spill at most a few dozen bytes per thread (checked offline
with ``python -m cplm_kernels.aot_check``, triton 3.6 and 3.9). Timing alternatives on an H200:
``benchmarks/copy_kernel.py --sweep-tiles``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_HEAD_DIMS = (32, 64, 128)


@dataclass(frozen=True)
class TileConfig:
    """Tile of one kernel: ``block_m`` query rows x ``block_n`` key rows per step."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 3
    shared_exp: bool = True  # reuse exp(s - lse_all) for the matching set when the gap allows

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"TileConfig.{name} must be a power of two >= 16 (tl.dot); got {value}")


@dataclass(frozen=True)
class KernelConfigs:
    """Tiles for the three kernels of one call."""

    forward: TileConfig
    grad_q: TileConfig
    grad_k: TileConfig


_GPU_TABLE = {  # bf16 / fp16 / fp8 operands (wgmma)
    32: KernelConfigs(TileConfig(128, 64, 4, 3), TileConfig(128, 64, 8, 3), TileConfig(64, 128, 8, 3)),
    64: KernelConfigs(TileConfig(128, 64, 4, 3), TileConfig(128, 64, 8, 3), TileConfig(64, 128, 8, 3)),
    128: KernelConfigs(TileConfig(128, 64, 8, 3), TileConfig(128, 64, 8, 2), TileConfig(64, 128, 8, 2)),
}
# fp32 operands take the exact (ieee) FMA path, not tensor cores: small tiles avoid register spills.
_GPU_FP32 = KernelConfigs(TileConfig(32, 32, 4, 2), TileConfig(32, 32, 4, 2), TileConfig(32, 32, 4, 2))

# The interpreter pays per program and per numpy op, not per element: 64 x 64 tiles measured
# fastest at T = 256 (about 2x faster than 32 x 32); tests pass smaller tiles explicitly.
_INTERPRETER = KernelConfigs(TileConfig(64, 64, 1, 1), TileConfig(64, 64, 1, 1), TileConfig(64, 64, 1, 1))


def select_configs(head_dim: int, dtype: torch.dtype, interpret: bool) -> KernelConfigs:
    """Tile table entry for ``head_dim`` (one of SUPPORTED_HEAD_DIMS) and q/k storage ``dtype``."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"fused copy kernel supports head dims {SUPPORTED_HEAD_DIMS}; got d_c={head_dim} "
            "(use cplm_kernels.copy_lse_chunked for other widths)"
        )
    if interpret:
        return _INTERPRETER
    return _GPU_FP32 if dtype == torch.float32 else _GPU_TABLE[head_dim]
