"""FP8 (e4m3) quantization of copy-head queries/keys with current (amax) scaling, in torch.

Scale layouts accepted by the fused kernel (``x ~= x_fp8.float() * scale``):

* per tensor: a 0-d (or one-element) fp32 tensor;
* per block of rows: fp32 ``[b, H, ceil(T / block_rows)]``; rows ``[i * block_rows, (i + 1) *
  block_rows)`` of head ``(b, h)`` share ``scale[b, h, i]``. The kernel needs ``block_rows`` too
  (``scale_block_rows`` of :func:`cplm_kernels.copy_lse_fused`); it is independent of the
  kernel's own tile sizes.

Quantization runs in torch, never inside a Triton kernel (see :mod:`cplm_kernels.interpreter`).
"""
from __future__ import annotations

import math

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
DEFAULT_SCALE_BLOCK_ROWS = 128


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """amax -> scale mapping amax onto FP8_MAX; all-zero blocks get scale 1 (any scale is exact)."""
    amax = amax.float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _check_rows_layout(x: torch.Tensor, block_rows: int) -> None:
    if x.dim() != 4:
        raise ValueError(f"per-block FP8 scaling needs x shaped [b, H, T, d]; got shape {tuple(x.shape)}")
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1; got {block_rows}")


def quantize_fp8(x: torch.Tensor, block_rows: int | None = None,
                 amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to float8_e4m3fn with current amax scaling; returns ``(x_fp8, scale)``.

    ``block_rows=None``: one scale for the whole tensor (0-d), from ``amax`` when given (e.g. the amax of the
    whole tensor of which ``x`` is a part; it must be >= x's own or values clip). Otherwise ``x`` is ``[b, H, T, d]``
    and each block of ``block_rows`` rows per head gets its own scale (``[b, H, ceil(T/block_rows)]``).
    Not differentiable (use :func:`cplm_kernels.copy_lse_fused_fp8` for straight-through training).
    """
    if not x.is_floating_point() or x.dtype == FP8_DTYPE:
        raise ValueError(f"quantize_fp8 expects a bf16/fp16/fp32 tensor; got dtype {x.dtype}")
    x = x.detach()
    if amax is not None and block_rows is not None:
        raise ValueError("amax is the per-tensor amax: it needs block_rows=None")
    if block_rows is None:
        scale = _scale_from_amax(x.abs().amax() if amax is None else amax.detach().reshape(()).to(x.device))
        return _to_fp8(x, scale), scale
    _check_rows_layout(x, block_rows)
    b, H, T, d = x.shape
    n_blocks = math.ceil(T / block_rows)
    padded = torch.nn.functional.pad(x, (0, 0, 0, n_blocks * block_rows - T))
    amax = padded.abs().reshape(b, H, n_blocks, block_rows * d).amax(dim=-1)
    scale = _scale_from_amax(amax)
    return _to_fp8(x, expand_row_scale(scale, block_rows, T)[..., None]), scale


def expand_row_scale(scale: torch.Tensor, block_rows: int, T: int) -> torch.Tensor:
    """Per-block scales ``[b, H, n_blocks]`` -> per-row scales ``[b, H, T]``."""
    return scale.repeat_interleave(block_rows, dim=-1)[..., :T]


def dequantize_fp8(x_fp8: torch.Tensor, scale: torch.Tensor, block_rows: int | None = None) -> torch.Tensor:
    """Inverse of :func:`quantize_fp8` in fp32 (the values the fused kernel computes with)."""
    if scale.dim() == 0 or scale.numel() == 1:
        return x_fp8.float() * scale.float().reshape(())
    if block_rows is None:
        raise ValueError(f"scale has shape {tuple(scale.shape)} (per block of rows): pass block_rows")
    return x_fp8.float() * expand_row_scale(scale.float(), block_rows, x_fp8.shape[2])[..., None]
