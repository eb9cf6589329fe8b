"""cplm_kernels: Copy-Paste score kernels (fused Triton on GPU) and their PyTorch references; the LM
head's linear cross entropy without a logits tensor (``linear_cross_entropy``).

Importable without megatron-core and without triton; the Triton path (``copy_lse_fused``,
``copy_lse_fused_fp8``) is imported on first attribute access.
"""
from cplm_kernels.fp8 import dequantize_fp8, quantize_fp8  # noqa: F401
from cplm_kernels.interpreter import fused_available  # noqa: F401
from cplm_kernels.linear_ce import (  # noqa: F401
    CEChunks,
    linear_cross_entropy,
    linear_cross_entropy_reference,
)
from cplm_kernels.reference import (  # noqa: F401
    copy_distribution,
    copy_lse_chunked,
    copy_lse_naive,
    default_scale,
)

_FUSED_EXPORTS = ("copy_lse_fused", "copy_lse_fused_fp8")


def __getattr__(name: str):
    """Lazy import of the Triton-backed entry points (PEP 562)."""
    if name in _FUSED_EXPORTS:
        try:
            from cplm_kernels import fused
        except ImportError as err:
            raise ImportError(
                f"cplm_kernels.{name} needs triton ({err}); install the 'gpu' or 'dev' extra, or use "
                "cplm_kernels.copy_lse_chunked"
            ) from err
        return getattr(fused, name)
    raise AttributeError(f"module 'cplm_kernels' has no attribute {name!r}")
