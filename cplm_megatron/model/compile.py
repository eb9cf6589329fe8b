"""`model.compile`: torch.compile of each transformer layer, as torchtitan compiles each block.

Without Transformer Engine, megatron-core's local layer runs RoPE (cos, sin, casts, rotate-half concatenations),
SwiGLU, the residual adds and the norms' casts as separate kernels: ~80 per layer per training step. Inductor
fuses them; the matrix multiplies and SDPA stay the library kernels. Each layer is compiled in place
(`nn.Module.compile`: parameter names and checkpoints are unchanged), and every layer of a chunk runs the same
compiled code (one compilation, not one per layer). The embedding, the LM head and its loss, the copy head and the
optimizer stay eager.

Document-masked attention (data-dependent spans) runs eager inside the compiled layer (`SDPAttention._documents`
is excluded: one graph break per layer); causal attention is traced. Tensor and context parallelism are refused
(their communication runs inside megatron-core's autograd functions; untested under compile), and so is activation
recomputation (megatron-core's checkpoint function breaks a layer's graph 5-7 times); pipeline stages compile their
own layers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from cplm_megatron.errors import ConfigError

if TYPE_CHECKING:  # config validation imports no torch
    import torch

    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.parallel.config import ParallelConfig


def check_compile(model: ModelConfig, parallel: ParallelConfig, recompute: str = "none") -> None:
    """Refuse `model.compile=true` on the layouts and with the activation recomputation it does not support (one
    line naming the fix); `recompute`: recompute.granularity."""
    if not model.compile:
        return
    for key, size in (("tp", parallel.tp), ("cp", parallel.cp)):
        if size > 1:
            raise ConfigError(f"model.compile=true supports parallel.tp=1 and parallel.cp=1 (got parallel.{key}="
                              f"{size}): set model.compile=false, or parallelize over data and pipeline stages")
    if recompute != "none":  # megatron-core's checkpoint function (RNG state save/restore) breaks the layer's graph
        raise ConfigError(f"model.compile=true does not combine with recompute.granularity={recompute}: set "
                          "recompute.granularity=none or model.compile=false")


def decoder_layers(chunk: torch.nn.Module) -> list:
    """The transformer layers of an unwrapped model chunk (none on a stage without layers)."""
    decoder = getattr(chunk, "decoder", None)
    return list(decoder.layers) if decoder is not None else []


def compile_layers(chunk: torch.nn.Module) -> int:
    """Compile each transformer layer of `chunk` in place (inductor, default mode); returns how many."""
    layers = decoder_layers(chunk)
    for layer in layers:
        layer.compile()
    return len(layers)
