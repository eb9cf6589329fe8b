"""Tile sizes and launch parameters of the fused kernels: a table keyed on (grid size, head width, dtype).

A table rather than ``triton.autotune``: no benchmarking at first call (the benchmark and the training job
start fast and run reproducibly: the same shape always takes the same tiles), and a call compiles one variant of
each of its four kernels, once (seconds, on first use). The entries were chosen on sm_90
from the compiled code (``python -m cplm_kernels.aot_check`` prints registers and spills; the SASS of the inner
loops was counted per score) and from the Triton fused-attention tutorial's Hopper shapes:

* forward: query tile 128 x key tile 64, 4 warps (one warpgroup, 64 scores per thread: ~15 instructions per score
  at d=64, 255 registers, two programs per SM). When the grid is small (``b*H*Tq < SMALL_GRID_ROWS``: fewer than
  256 query tiles of 128 rows, under one wave of two programs per SM on 132 SMs), the longest causal row alone
  sets the time, so 64-row query tiles halve the work per step on that row (~19 instructions per score, 143
  registers, three programs per SM);
* dQ (keys stream along the MMA rows) and dK (queries stream along the rows): 64 x 64 tiles, 4 warps, 2 stages
  (~11-12 instructions per score at d=64, <= 255 registers and <= 90 KiB of shared memory at d=128: two
  programs per SM); larger tiles spill (dQ 128 x 64) or gain < 10% of instructions for half the programs.

fp32 operands take the exact (ieee) FMA path, not tensor cores: small tiles avoid register spills. Timing
alternatives on a GPU: ``python -m benchmarks.copy_kernel --sweep-tiles``.
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
    """Tiles of one call: forward, dQ and dK (the backward statistics kernel follows dK's query tiles)."""

    forward: TileConfig
    grad_q: TileConfig
    grad_k: TileConfig


SMALL_GRID_ROWS = 32768  # b * H * Tq below this: the forward takes 64-row query tiles (see the module docstring)

_FORWARD = {32: TileConfig(128, 64, 4, 3), 64: TileConfig(128, 64, 4, 3), 128: TileConfig(128, 64, 4, 2)}
_FORWARD_SMALL_GRID = TileConfig(64, 64, 4, 3)
_GRAD = TileConfig(64, 64, 4, 2)  # dQ and dK, every head width (bf16 / fp16 / fp8 operands)
# fp32 operands take the exact (ieee) FMA path, not tensor cores: small tiles, none spilling registers at d=128.
_GPU_FP32 = KernelConfigs(TileConfig(32, 16, 4, 2), TileConfig(16, 16, 4, 2), TileConfig(16, 32, 4, 2))

# The interpreter pays per program and per numpy op, not per element: 64 x 64 tiles measured
# fastest at T = 256 (about 2x faster than 32 x 32); tests pass smaller tiles explicitly.
_INTERPRETER = KernelConfigs(TileConfig(64, 64, 1, 1), TileConfig(64, 64, 1, 1), TileConfig(64, 64, 1, 1))


def select_configs(head_dim: int, dtype: torch.dtype, interpret: bool, rows: int = SMALL_GRID_ROWS) -> KernelConfigs:
    """Table entry for ``head_dim`` (one of SUPPORTED_HEAD_DIMS), q/k storage ``dtype`` and ``rows`` = b * H * Tq
    (the query rows of one call); the interpreter always takes one entry."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"fused copy kernel supports head dims {SUPPORTED_HEAD_DIMS}; got d_c={head_dim} "
            "(use cplm_kernels.copy_lse_chunked for other widths)"
        )
    if interpret:
        return _INTERPRETER
    if dtype == torch.float32:
        return _GPU_FP32
    forward = _FORWARD_SMALL_GRID if rows < SMALL_GRID_ROWS else _FORWARD[head_dim]
    return KernelConfigs(forward, _GRAD, _GRAD)
