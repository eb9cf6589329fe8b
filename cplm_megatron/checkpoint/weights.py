"""Model weights as layout-independent torch_dist checkpoints (megatron.core.dist_checkpointing).

Sharded keys are global (layer numbers, full tensor shapes), so weights saved under one TP/PP/VPP
layout load under any other.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Union

import torch


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def model_sharded_state_dict(chunks: List[torch.nn.Module]) -> Dict:
    """{'model': ...} for one chunk, {'model0': ..., 'model1': ...} for virtual pipeline chunks."""
    if len(chunks) == 1:
        return {"model": unwrap(chunks[0]).sharded_state_dict()}
    return {f"model{i}": unwrap(c).sharded_state_dict() for i, c in enumerate(chunks)}


def load_model_state(chunks: List[torch.nn.Module], loaded: Dict) -> None:
    """Copy a loaded (model part of a) dist-checkpoint state dict into the chunks, strictly."""
    if len(chunks) == 1:
        unwrap(chunks[0]).load_state_dict(loaded["model"], strict=True)
    else:
        for i, c in enumerate(chunks):
            unwrap(c).load_state_dict(loaded[f"model{i}"], strict=True)


def save_weights(chunks: List[torch.nn.Module], directory: Union[str, Path]) -> None:
    """Collective: save only the model weights (all ranks call this)."""
    from megatron.core import dist_checkpointing

    Path(directory).mkdir(parents=True, exist_ok=True)
    dist_checkpointing.save(model_sharded_state_dict(chunks), str(directory))


def _check(directory: Union[str, Path]) -> None:
    """A torch_dist checkpoint is at `directory`, and a trainer checkpoint's files match the checksums recorded when
    it was saved (lookup.verify_contents; weights saved by `save_weights` carry none)."""
    from cplm_megatron.checkpoint.lookup import is_committed, verify_contents

    if not Path(directory, "metadata.json").is_file():
        raise FileNotFoundError(f"no torch_dist checkpoint at {directory} (metadata.json missing)")
    if is_committed(Path(directory)):
        verify_contents(Path(directory))


def load_weights(chunks: List[torch.nn.Module], directory: Union[str, Path], verified: bool = False) -> None:
    """Collective: load model weights saved under any layout (`verified`: the caller checked the checksums already,
    lookup.resolve_verified)."""
    from megatron.core import dist_checkpointing

    if not verified:
        _check(directory)
    loaded = dist_checkpointing.load(model_sharded_state_dict(chunks), str(directory))
    load_model_state(chunks, loaded)


def load_plain_tensors(directory: Union[str, Path]) -> Dict[str, torch.Tensor]:
    """Single process, no parallel state needed: every full tensor of a torch_dist checkpoint by key."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from cplm_megatron.parallel.distributed import free_port

    _check(directory)
    if not dist.is_initialized():  # the torch_dist reader needs a (here: one-process) group
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    return dist_checkpointing.load_plain_tensors(str(directory))
