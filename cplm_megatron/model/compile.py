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
    """The transformer layers of a model chunk, wrapped (Float16Module, DDP) or not."""
    from megatron.core.utils import get_attr_wrapped_model

    decoder = get_attr_wrapped_model(chunk, "decoder")
    return list(decoder.layers) if decoder is not None else []


def compile_chunks(chunks: list) -> int:
    """Compile every transformer layer of a run's model chunks in place (inductor, default mode), after dropping
    whatever this process compiled before (`forget_compiled`); returns how many layers."""
    forget_compiled()
    return sum(compile_layers(chunk) for chunk in chunks)


def forget_compiled() -> None:
    """Drop what torch.compile compiled earlier in this process, so a new run's layers compile for their own shapes
    as in a fresh process (a process training several runs would otherwise recompile with dynamic shapes, and stop
    compiling past dynamo's recompilation limit)."""
    import torch._dynamo

    torch._dynamo.reset()


def compile_layers(chunk: torch.nn.Module) -> int:
    """Compile each transformer layer of one chunk in place; returns how many."""
    layers = decoder_layers(chunk)
    for layer in layers:
        layer.compile()
    return len(layers)
