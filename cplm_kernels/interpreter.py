"""Where the fused kernels run (GPU or Triton's CPU interpreter) and how each dtype enters ``tl.dot``.

The one place that knows about the interpreter: the kernels never test the environment themselves:
they take the integer modes chosen here as ``tl.constexpr`` arguments. Interpreter quirks handled
here (measured with triton 3.9):

* ``tl.dot`` on bf16 operands returns garbage in the interpreter -> every dot operand is cast to
  fp32 when interpreting (exact for bf16/fp16/fp8 values, so tolerances need not be loosened);
* casting *to* fp8 inside a kernel is wrong for ~2.5% of values -> the kernels never cast to fp8;
  quantization happens in torch (:mod:`cplm_kernels.fp8`), kernels only load fp8 and upcast.

Importable without triton.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Operand conversions applied right before a tl.dot (kernel constexpr codes).
DOT_NATIVE = 0  # operands as loaded (bf16/fp16 tensor cores, fp8 tensor cores)
DOT_FP32 = 1  # upcast to fp32 (fp32 inputs; every dot in the interpreter)
DOT_BF16 = 2  # upcast to bf16: the fp8 path's gradient matmuls (e4m3 values are exact in bf16)

# Triton supports e4m3 (fp8e4nv) only from Ada (sm_89) on; there and on Hopper (sm_90) tl.dot
# takes fp8 x fp8 operands natively with fp32 accumulation (verified with aot_check --arch 89/90).
FP8_MIN_CAPABILITY = (8, 9)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1).

    Triton reads the variable when a kernel is decorated, so it must be set before the first
    import of :mod:`cplm_kernels.triton_copy` (tests set it in their conftest).
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DotPlan:
    """How the kernels feed ``tl.dot`` for one input dtype on one device."""

    score_mode: int  # conversion of q and k for the scores q @ k^T
    grad_mode: int  # conversion of (dS, k) and (dS^T, q) for the gradient matmuls
    input_precision: str  # tl.dot input_precision; "ieee" keeps fp32 operands exact (no tf32)


def dot_plan(dtype: torch.dtype, capability: tuple[int, int] | None) -> DotPlan:
    """Operand conversions for q/k stored as ``dtype`` on a GPU of compute ``capability``
    (``None``: the Triton interpreter)."""
    if capability is None:
        return DotPlan(DOT_FP32, DOT_FP32, "ieee")
    if dtype == torch.float32:
        return DotPlan(DOT_FP32, DOT_FP32, "ieee")
    if dtype in (torch.bfloat16, torch.float16):
        return DotPlan(DOT_NATIVE, DOT_NATIVE, "tf32")  # tl.dot's default; unused for 16-bit operands
    if dtype == torch.float8_e4m3fn:
        if tuple(capability) < FP8_MIN_CAPABILITY:
            raise ValueError(
                f"float8_e4m3fn q/k need a GPU of compute capability >= {FP8_MIN_CAPABILITY} (Ada/Hopper); this one "
                f"is {tuple(capability)}: pass bf16 q/k (copy_lse_fused) instead of FP8"
            )
        return DotPlan(DOT_NATIVE, DOT_BF16, "tf32")
    raise ValueError(f"no tl.dot plan for dtype {dtype}; expected float32, bfloat16, float16 or float8_e4m3fn")


def fused_available() -> bool:
    """True when the fused kernels can run here: triton imports and there is a CUDA device, or the
    Triton interpreter is on (TRITON_INTERPRET=1, CPU tensors)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return interpreting() or torch.cuda.is_available()


def kernels_are_interpreted(kernel: object) -> bool:
    """Whether a @triton.jit kernel object was built for the interpreter (decided at import time)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_kernel_placement(kernel: object, tensor: torch.Tensor, what: str) -> bool:
    """Whether ``kernel`` runs interpreted; refuses a ``tensor`` on the other kind of device."""
    interpreted = kernels_are_interpreted(kernel)
    if tensor.is_cuda == interpreted:
        raise RuntimeError(
            f"{what} kernels were built {'for the Triton interpreter' if interpreted else 'for the GPU'} but their "
            f"input is on {tensor.device}: use CUDA tensors without TRITON_INTERPRET, or CPU tensors with "
            "TRITON_INTERPRET=1 set before triton is first imported"
        )
    return interpreted
