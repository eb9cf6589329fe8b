"""Fused Copy-Paste scores: the autograd Function over the Triton kernels and its public entry points.

Same semantics as :func:`cplm_kernels.reference.copy_lse_naive` (see that module): outputs fp32
``[b, H, T]`` (``-inf`` for empty sets), memory O(b * H * T) besides the inputs, gradients of empty
rows zero. ``q``/``k`` may be strided views (e.g. ``[b, H, T, d]`` views of a ``[T, b, H * d]``
projection): the kernels take strides, nothing is copied. Context parallelism: with ``q_positions`` (int ``[Tq]``,
strictly increasing) q holds only those global positions of the sequence while k, labels and doc_ids hold all
``T`` (see :func:`cplm_kernels.reference.copy_lse_naive`); outputs and dq are ``[b, H, Tq]`` / ``[b, H, Tq, d]``,
dk is the gradient of the whole ``[b, H, T, d]`` k from these queries only. Imports triton: load it lazily through
``cplm_kernels`` (``import cplm_kernels`` works without triton).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import triton

from cplm_kernels import triton_copy
from cplm_kernels.block_bounds import (
    DocumentIndex,
    index_documents,
    key_tile_query_bounds,
    key_tile_query_end,
    query_tile_key_start,
)
from cplm_kernels.configs import KernelConfigs, TileConfig, select_configs
from cplm_kernels.fp8 import DEFAULT_SCALE_BLOCK_ROWS, FP8_DTYPE, quantize_fp8
from cplm_kernels.interpreter import DotPlan, check_kernel_placement, dot_plan
from cplm_kernels.reference import default_scale

LOG2E = 1.4426950408889634
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, FP8_DTYPE)


@dataclass(frozen=True)
class RowScale:
    """FP8 dequantization scales as the kernels read them: ``scale[b, h, row // rows]`` via strides."""

    tensor: torch.Tensor
    strides: tuple[int, int, int]
    rows: int

    @staticmethod
    def unused(device: torch.device) -> RowScale:
        return RowScale(torch.ones(1, dtype=torch.float32, device=device), (0, 0, 0), 1)


@dataclass(frozen=True)
class KernelOperands:
    """What the kernels read for q and k: the storage tensors plus their FP8 scales (if any)."""

    q: torch.Tensor
    k: torch.Tensor
    q_scale: RowScale
    k_scale: RowScale

    @property
    def is_fp8(self) -> bool:
        return self.q.dtype == FP8_DTYPE

    @property
    def scales_mode(self) -> int:
        """The kernels' ``SCALES``: 0 without FP8, 1 one scale per tensor (folded into the score scale), 2 per
        block of rows."""
        if not self.is_fp8:
            return 0
        per_tensor = all(scale.tensor.numel() == 1 for scale in (self.q_scale, self.k_scale))
        return 1 if per_tensor else 2


def row_scale_view(scale: torch.Tensor, name: str, x: torch.Tensor, block_rows: int) -> RowScale:
    """Validate an FP8 scale (per tensor, or per block of ``block_rows`` rows) and describe it for the kernels."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (fp32), got {type(scale).__name__}")
    b, H, T, _ = x.shape
    scale = scale.to(device=x.device, dtype=torch.float32)
    if scale.numel() == 1:
        return RowScale(scale.reshape(1), (0, 0, 0), 1)
    n_blocks = math.ceil(T / block_rows)
    if tuple(scale.shape) != (b, H, n_blocks):
        raise ValueError(
            f"{name} has shape {tuple(scale.shape)}; expected a one-element tensor (per tensor) or "
            f"[b, H, ceil(T / scale_block_rows)] = {(b, H, n_blocks)} with scale_block_rows={block_rows} "
            "(pass the block_rows given to quantize_fp8 as scale_block_rows)"
        )
    return RowScale(scale, tuple(scale.stride()), block_rows)


def _check_positions(q_positions: torch.Tensor, q: torch.Tensor, T: int) -> None:
    """Global query positions: an integer ``[Tq]`` vector, strictly increasing, inside ``[0, T)``."""
    Tq = q.shape[2]
    if q_positions.dim() != 1 or q_positions.shape[0] != Tq or q_positions.is_floating_point() \
            or q_positions.dtype == torch.bool:
        raise ValueError(f"q_positions must be an integer tensor of shape [Tq] = [{Tq}] (q's rows); got "
                         f"{q_positions.dtype} {tuple(q_positions.shape)}")
    if q_positions.device != q.device:
        raise ValueError(f"q_positions is on {q_positions.device} but q is on {q.device}")
    if Tq and (int(q_positions[0]) < 0 or int(q_positions[-1]) >= T or not bool((q_positions.diff() > 0).all())):
        raise ValueError(f"q_positions must be strictly increasing global positions in [0, {T}) (k's rows)")


def _check_inputs(q: torch.Tensor, k: torch.Tensor, labels: torch.Tensor, doc_ids: torch.Tensor | None,
                  q_positions: torch.Tensor | None = None) -> None:
    same = q.shape == k.shape if q_positions is None else (q.shape[:2] + q.shape[3:] == k.shape[:2] + k.shape[3:])
    if q.dim() != 4 or k.dim() != 4 or not same:
        rows = "T" if q_positions is None else "Tq / T"
        raise ValueError(f"q and k must both be [b, H, {rows}, d]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.dtype != k.dtype or q.dtype not in _INPUT_DTYPES:
        raise ValueError(f"q/k dtypes must match and be one of {_INPUT_DTYPES}; got {q.dtype}, {k.dtype}")
    b, _, T, _ = k.shape
    for name, t in (("labels", labels), ("doc_ids", doc_ids)):
        if t is None:
            continue
        if tuple(t.shape) != (b, T) or t.is_floating_point() or t.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor of shape [b, T] = {(b, T)}; got {t.dtype} "
                             f"{tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if k.device != q.device:
        raise ValueError(f"k is on {k.device} but q is on {q.device}")
    if q_positions is not None:
        _check_positions(q_positions, q, T)
    check_kernel_placement(triton_copy.copy_lse_fwd_kernel, q, "fused copy")


@dataclass(frozen=True)
class Launch:
    """Everything the kernels of one call share."""

    ops: KernelOperands
    labels: torch.Tensor  # int32 [b, T]
    docs: DocumentIndex | None  # compact int32 document ranks and spans (None: one document per row)
    scale: float
    plan: DotPlan
    configs: KernelConfigs
    positions: torch.Tensor | None  # int32 [Tq]: the global position of each query row (None: 0 .. T-1, no CP)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """q's [b, H, Tq, d]."""
        return tuple(self.ops.q.shape)

    @property
    def keys(self) -> int:
        """T: k's rows (the whole sequence)."""
        return self.ops.k.shape[2]

    def stride_args(self, bound: torch.Tensor) -> tuple:
        doc = self.docs.rank if self.docs is not None else self.labels  # unused pointer without documents
        return (*self.ops.q.stride(), *self.ops.k.stride(), *self.labels.stride(), *doc.stride(),
                *self.ops.q_scale.strides, *self.ops.k_scale.strides, self.ops.q_scale.rows,
                self.ops.k_scale.rows, bound.stride(0))

    def pointer_args(self, *bounds: torch.Tensor) -> tuple:
        doc = self.docs.rank if self.docs is not None else self.labels
        positions = self.positions if self.positions is not None else self.labels  # unused pointer without CP
        return (self.ops.q, self.ops.k, self.labels, doc, self.ops.q_scale.tensor, self.ops.k_scale.tensor,
                positions, *bounds)

    def key_start(self, tile: TileConfig) -> torch.Tensor:
        """Per query tile, the first key to visit (unused pointer without documents)."""
        if self.docs is None:
            return self.labels
        first = self.docs.first if self.positions is None else self.docs.first[:, self.positions]
        return query_tile_key_start(first, tile.block_m, tile.block_n, self.keys)

    def query_bounds(self, tile: TileConfig) -> torch.Tensor:
        """Per key tile, the first query row to visit and the first one past all its keys (multiples of block_m;
        computed in the kernel without CP: an unused pointer)."""
        if self.positions is None:
            return self.labels
        return key_tile_query_bounds(self.positions, self.keys, tile.block_m, tile.block_n)

    def query_end(self, tile: TileConfig) -> torch.Tensor:
        """Per key tile, one past the last query row to visit (unused pointer without documents)."""
        if self.docs is None:
            return self.labels
        end = key_tile_query_end(self.docs.last, tile.block_n)  # a global position
        if self.positions is None:
            return end
        return torch.searchsorted(self.positions, end, side="left").to(torch.int32).contiguous()

    def constexprs(self, tile: TileConfig, with_grad_mode: bool) -> dict:
        extra = {"GRAD_MODE": self.plan.grad_mode} if with_grad_mode else {}
        return dict(HEAD_DIM=self.shape[3], BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
                    HAS_DOC=self.docs is not None, HAS_QPOS=self.positions is not None, SCALES=self.ops.scales_mode,
                    SCORE_MODE=self.plan.score_mode, PRECISION=self.plan.input_precision,
                    SHARED_EXP=tile.shared_exp, **extra)


@dataclass(frozen=True)
class KernelCall:
    """One kernel launch, fully described (launched by the autograd Function, AOT-compiled by
    :mod:`cplm_kernels.aot_check`)."""

    kernel: object
    grid: tuple[int, int]
    args: tuple
    constexprs: dict
    num_warps: int
    num_stages: int

    def launch(self, device: torch.device) -> None:
        with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
            self.kernel[self.grid](*self.args, **self.constexprs, num_warps=self.num_warps,
                                   num_stages=self.num_stages)


def forward_call(launch: Launch, lse_all: torch.Tensor, lse_match: torch.Tensor) -> KernelCall:
    """The forward kernel writing both LSEs into contiguous ``[b, H, Tq]`` fp32 outputs."""
    b, H, T, _ = launch.shape
    tile = launch.configs.forward
    bound = launch.key_start(tile)
    args = (*launch.pointer_args(bound), lse_all, lse_match, *launch.stride_args(bound),
            H, T, launch.keys, launch.scale * LOG2E)
    return KernelCall(triton_copy.copy_lse_fwd_kernel, (triton.cdiv(T, tile.block_m), b * H), args,
                      launch.constexprs(tile, with_grad_mode=False), tile.num_warps, tile.num_stages)


def stats_call(launch: Launch, lse_all, lse_match, g_all, g_match, stats: torch.Tensor,
               exact: torch.Tensor) -> KernelCall:
    """The backward statistics kernel: per query row ``stats`` [N_STATS, b*H*Tq] fp32, per dK query tile
    ``exact`` [b*H, tiles] int32 (see :func:`cplm_kernels.triton_copy.copy_lse_bwd_stats_kernel`)."""
    b, H, T, _ = launch.shape
    block = launch.configs.grad_k.block_m  # dK's query tiles: one flag each
    args = (lse_all, lse_match, g_all, g_match, stats, exact, *g_all.stride(), *g_match.stride(), H, T, launch.scale)
    return KernelCall(triton_copy.copy_lse_bwd_stats_kernel, (triton.cdiv(T, block), b * H), args,
                      {"BLOCK": block}, 4, 1)


def grad_call(launch: Launch, which: str, stats: torch.Tensor, exact: torch.Tensor, out: torch.Tensor) -> KernelCall:
    """The dQ (``which == "q"``, ``out`` [b, H, Tq, d]) or dK (``out`` [b, H, T, d]) kernel, contiguous ``out``,
    reading the statistics kernel's ``stats`` (and, dK, its ``exact`` flags)."""
    b, H, T, _ = launch.shape
    if which == "q":
        tile, kernel = launch.configs.grad_q, triton_copy.copy_lse_bwd_dq_kernel
        bound, n_tiles = launch.key_start(tile), triton.cdiv(T, tile.block_m)
        bounds, outputs = (bound,), (stats, out)
    else:
        tile, kernel = launch.configs.grad_k, triton_copy.copy_lse_bwd_dk_kernel
        bound, n_tiles = launch.query_end(tile), triton.cdiv(launch.keys, tile.block_n)
        bounds, outputs = (launch.query_bounds(tile), bound), (stats, exact, out)
    args = (*launch.pointer_args(*bounds), *outputs, *launch.stride_args(bound), H, T, launch.keys,
            launch.scale * LOG2E)
    return KernelCall(kernel, (n_tiles, b * H), args, launch.constexprs(tile, with_grad_mode=True),
                      tile.num_warps, tile.num_stages)


def _forward(launch: Launch) -> tuple[torch.Tensor, torch.Tensor]:
    b, H, T, _ = launch.shape
    lse_all = torch.empty(b, H, T, dtype=torch.float32, device=launch.ops.q.device)
    lse_match = torch.empty_like(lse_all)
    if lse_all.numel() > 0:
        forward_call(launch, lse_all, lse_match).launch(lse_all.device)
    return lse_all, lse_match


def _grads(launch: Launch, lse_all, lse_match, g_all, g_match, needs: tuple[bool, bool], dtypes) -> list:
    """[dq, dk] (None where not needed), contiguous, in ``dtypes``: the statistics kernel, then dQ and dK."""
    b, H, T, _ = launch.shape
    device = launch.ops.q.device
    outs = [torch.empty(shape, dtype=dtype, device=device) if need else None
            for need, shape, dtype in zip(needs, (launch.shape, tuple(launch.ops.k.shape)), dtypes)]
    if lse_all.numel() == 0 or not any(needs):
        return outs
    stats = torch.empty(triton_copy.N_STATS, b * H * T, dtype=torch.float32, device=device)
    exact = torch.empty(b * H, triton.cdiv(T, launch.configs.grad_k.block_m), dtype=torch.int32, device=device)
    stats_call(launch, lse_all, lse_match, g_all, g_match, stats, exact).launch(device)
    for which, out in zip("qk", outs):
        if out is not None:
            grad_call(launch, which, stats, exact, out).launch(device)
    return outs


class _FusedCopyLSE(torch.autograd.Function):
    """(lse_all, lse_match) of the kernels; gradients w.r.t. q and k (straight-through for FP8 operands)."""

    @staticmethod
    def forward(ctx, q, k, launch: Launch):
        lse_all, lse_match = _forward(launch)
        ops = launch.ops
        docs = launch.docs or DocumentIndex(None, None, None)
        ctx.save_for_backward(ops.q, ops.k, ops.q_scale.tensor, ops.k_scale.tensor, launch.labels,
                              docs.rank, docs.first, docs.last, lse_all, lse_match, launch.positions)
        ctx.launch_meta = (ops.q_scale.strides, ops.q_scale.rows, ops.k_scale.strides, ops.k_scale.rows,
                           launch.scale, launch.plan, launch.configs)
        ctx.grad_dtypes = (q.dtype, k.dtype)
        return lse_all, lse_match

    @staticmethod
    def backward(ctx, g_all, g_match):
        oq, ok, qs, ks, labels, rank, first, last, lse_all, lse_match, positions = ctx.saved_tensors
        qs_strides, qs_rows, ks_strides, ks_rows, scale, plan, configs = ctx.launch_meta
        ops = KernelOperands(oq, ok, RowScale(qs, qs_strides, qs_rows), RowScale(ks, ks_strides, ks_rows))
        docs = DocumentIndex(rank, first, last) if rank is not None else None
        launch = Launch(ops, labels, docs, scale, plan, configs, positions)
        dq, dk = _grads(launch, lse_all, lse_match, g_all, g_match, tuple(ctx.needs_input_grad[:2]), ctx.grad_dtypes)
        return dq, dk, None


def make_launch(ops: KernelOperands, labels, doc_ids, scale: float | None, capability: tuple[int, int] | None,
                configs: KernelConfigs | None = None, q_positions: torch.Tensor | None = None) -> Launch:
    """Describe one call for a GPU of compute ``capability`` (``None``: the Triton interpreter).

    Labels are compared as int32 (token ids), documents as compact int32 ranks; ``q_positions`` as int32 (None:
    the rows are the positions, 0 .. Tq-1, and the kernels compute their bounds from them). The tiles come from
    the table for this head width, dtype and b * H * Tq query rows unless ``configs`` is given.
    """
    head_dim = ops.q.shape[-1]
    return Launch(
        ops=ops, labels=labels.to(torch.int32), docs=index_documents(doc_ids) if doc_ids is not None else None,
        scale=float(default_scale(head_dim) if scale is None else scale),
        plan=dot_plan(ops.q.dtype, capability),
        configs=configs or select_configs(head_dim, ops.q.dtype, interpret=capability is None,
                                          rows=ops.q.shape[0] * ops.q.shape[1] * ops.q.shape[2]),
        positions=None if q_positions is None else q_positions.to(torch.int32).contiguous(),
    )


def _run(q, k, labels, doc_ids, scale, ops: KernelOperands, configs: KernelConfigs | None, q_positions=None):
    capability = None if not ops.q.is_cuda else torch.cuda.get_device_capability(ops.q.device)
    return _FusedCopyLSE.apply(q, k, make_launch(ops, labels, doc_ids, scale, capability, configs, q_positions))


def copy_lse_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    labels: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    q_scale: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    *,
    scale_block_rows: int = DEFAULT_SCALE_BLOCK_ROWS,
    configs: KernelConfigs | None = None,
    q_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``(lse_all, lse_match)`` ``[b, H, Tq]`` fp32; same values/gradients as ``copy_lse_naive``.

    ``q``/``k``: ``[b, H, T, d]`` (d in 32/64/128) in fp32/bf16/fp16, or float8_e4m3fn with
    ``q_scale``/``k_scale`` (one-element fp32 per tensor, or ``[b, H, ceil(T / scale_block_rows)]``
    per block of rows; see :mod:`cplm_kernels.fp8`). FP8 inputs give values only (no gradients into
    fp8 tensors): train with :func:`copy_lse_fused_fp8`. ``configs`` overrides the tile table.
    ``q_positions``: the queries' global positions under context parallelism (see the module docstring).
    """
    _check_inputs(q, k, labels, doc_ids, q_positions)
    if q.dtype == FP8_DTYPE:
        if q_scale is None or k_scale is None:
            raise ValueError("float8_e4m3fn q/k need q_scale and k_scale (see cplm_kernels.quantize_fp8)")
        if q.requires_grad or k.requires_grad:
            raise ValueError("gradients into float8 tensors are not supported: call copy_lse_fused_fp8 on the "
                             "bf16/fp32 q and k for straight-through FP8 training")
        ops = KernelOperands(q, k, row_scale_view(q_scale, "q_scale", q, scale_block_rows),
                        row_scale_view(k_scale, "k_scale", k, scale_block_rows))
    else:
        if q_scale is not None or k_scale is not None:
            raise ValueError(f"q_scale/k_scale are only for float8_e4m3fn q/k; got q/k of dtype {q.dtype}")
        ops = KernelOperands(q, k, RowScale.unused(q.device), RowScale.unused(q.device))
    return _run(q, k, labels, doc_ids, scale, ops, configs, q_positions)


def copy_lse_fused_fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    labels: torch.Tensor,
    doc_ids: torch.Tensor | None = None,
    scale: float | None = None,
    *,
    block_rows: int | None = None,
    configs: KernelConfigs | None = None,
    q_positions: torch.Tensor | None = None,
    q_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 scores for training: quantizes bf16/fp16/fp32 ``q``/``k`` with current amax scaling
    (per tensor, or per ``block_rows`` rows), runs the fused kernels on the fp8 values, and returns
    straight-through gradients (the exact gradients w.r.t. the dequantized q/k) in q/k's dtype.

    Context parallelism: ``q_positions`` as in :func:`copy_lse_fused`; ``q_amax`` (per-tensor scaling only)
    replaces q's own amax, e.g. by its maximum over the CP ranks so that each rank quantizes its queries
    exactly as one CP=1 call would (k is the whole sequence already)."""
    _check_inputs(q, k, labels, doc_ids, q_positions)
    if q.dtype == FP8_DTYPE:
        raise ValueError("copy_lse_fused_fp8 quantizes itself: pass bf16/fp16/fp32 q and k "
                         "(or call copy_lse_fused with float8 q/k and their scales)")
    if q_amax is not None and block_rows is not None:
        raise ValueError("q_amax is the per-tensor amax: it needs block_rows=None")
    rows = block_rows if block_rows is not None else DEFAULT_SCALE_BLOCK_ROWS
    q8, q_scale = quantize_fp8(q, block_rows, amax=q_amax)
    k8, k_scale = quantize_fp8(k, block_rows)
    ops = KernelOperands(q8, k8, row_scale_view(q_scale, "q_scale", q8, rows), row_scale_view(k_scale, "k_scale", k8, rows))
    return _run(q, k, labels, doc_ids, scale, ops, configs, q_positions)
