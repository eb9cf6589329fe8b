"""The Megatron side of conversion: find and read trainer checkpoints, write weights-only ones.

Reading needs no process group: the model's full tensors are read straight from the torch_dist
files (torch.distributed.checkpoint, `no_dist`), skipping optimizer state, and the saved run config
from the common state. Writing builds the real Megatron model at TP=PP=1 in this (single) process,
fills it and saves it with the trainer's `Checkpointer`, so the result reshards to any TP/PP exactly
like a training checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from cplm_megatron.checkpoint.lookup import (
    DIST_METADATA,
    CheckpointRecord,
    read_record,
    read_saved_config,
    resolve_verified,
)
from cplm_megatron.config.loader import build_dataclass
from cplm_megatron.errors import ConfigError
from cplm_megatron.hf.config_mapping import ConversionError
from cplm_megatron.model.config import ModelConfig
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.model.layout import single_process_megatron

log = logging.getLogger(__name__)

_LAYER_NAME = re.compile(r"^decoder\.layers\.(\d+)\.")


@dataclass
class MegatronCheckpoint:
    """One saved checkpoint: where it is and what model it holds (tensors are read on demand)."""

    path: Path  # the iter_* directory
    model: ModelConfig
    copy_head: CopyHeadConfig | None  # None: trained without the copy head
    config: dict[str, Any]  # the saved RunConfig as a dict
    record: CheckpointRecord  # cplm_state.json (iteration, layout, has_optimizer)

    @property
    def root(self) -> Path:
        """The checkpoint root (holding `latest` and the iter_* directories)."""
        return self.path.parent


def open_checkpoint(path: str | Path) -> MegatronCheckpoint:
    """Locate a checkpoint (`checkpoint.lookup.resolve_verified`: a run dir, its checkpoints/ root or an
    iter_* dir; its files checked against their checksums) and read its saved config (model + copy-head sections)
    and record."""
    iter_dir = resolve_verified(Path(path), say=log.warning).path
    config = read_saved_config(iter_dir)
    if not isinstance(config.get("model"), dict):
        raise ConversionError(
            f"{iter_dir} holds no saved run config (common state 'config' with a 'model' section); only "
            "checkpoints written by the trainer's Checkpointer (or tools/convert_from_hf.py) can be converted"
        )
    try:
        model = build_dataclass(ModelConfig, config["model"], "model")
        copy_head = build_dataclass(CopyHeadConfig, config.get("copy_head") or {}, "copy_head")
    except ConfigError as err:
        raise ConversionError(f"{iter_dir}: the saved config is not readable by this version: {err}") from err
    return MegatronCheckpoint(iter_dir, model, copy_head if copy_head.enabled else None, config, read_record(iter_dir))


def read_tensors(iter_dir: Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """The full tensors `keys` of a torch_dist checkpoint (single process, other tensors not read)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    backend = json.loads((iter_dir / DIST_METADATA).read_text()).get("sharded_backend")
    if backend != "torch_dist":
        raise ConversionError(f"{iter_dir / DIST_METADATA}: sharded_backend={backend!r}; only torch_dist checkpoints "
                              "(the trainer's format) can be read")
    reader = dcp.FileSystemReader(str(iter_dir))
    saved = reader.read_metadata().state_dict_metadata
    missing = [key for key in keys if not isinstance(saved.get(key), TensorStorageMetadata)]
    if missing:
        raise ConversionError(f"{iter_dir} lacks tensors the saved config implies: {missing}; the checkpoint "
                              "does not match its own config (or was written by another model)")
    tensors = {key: torch.empty(saved[key].size, dtype=saved[key].properties.dtype) for key in keys}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    # a bar on a terminal (tqdm's disable=None): one tensor at a time, by bytes
    with warnings.catch_warnings(), tqdm(total=total, desc="read checkpoint", unit="B", unit_scale=True,
                                         disable=None, leave=False) as bar:
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
        for key, tensor in tensors.items():
            dcp.load({key: tensor}, storage_reader=reader, no_dist=True)
            bar.update(tensor.numel() * tensor.element_size())
    return tensors


def fill_model(chunk: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Load full Megatron tensors (by sharded key) into a TP=PP=1 model; returns the keys left at init.

    Names map to keys through the model's own sharded state dict, so the local and TE layer specs
    (and their key renames) are handled alike. Only copy-head parameters may be left at init.
    """
    state = chunk.state_dict()
    used: set[str] = set()
    left: list[str] = []
    for name, entry in chunk.sharded_state_dict().items():
        key = getattr(entry, "key", None)
        if key is None or key.endswith("_extra_state") or name not in state:
            continue
        if key not in tensors:
            left.append(key)
            continue
        layer = _LAYER_NAME.match(name)
        value = tensors[key][int(layer.group(1))] if layer else tensors[key]
        if tuple(value.shape) != tuple(state[name].shape):
            raise ConversionError(f"{key}: tensor shape {list(value.shape)} does not fit the model parameter "
                                  f"{name} {list(state[name].shape)}")
        state[name] = value
        used.add(key)
    not_head = [key for key in left if not key.startswith("copy_head.")]
    unused = sorted(set(tensors) - used)
    if not_head or unused:
        raise ConversionError(f"tensors do not match the Megatron model: missing {not_head}, unused {unused}")
    chunk.load_state_dict(state, strict=True)
    return left


def write_weights_checkpoint(
    root: str | Path,
    model: ModelConfig,
    copy_head: CopyHeadConfig | None,
    tensors: Mapping[str, torch.Tensor],
    run_config: dict[str, Any],
    seed: int = 1234,
) -> Path:
    """Write `tensors` as `root/iter_0000000` + `root/latest` (weights only, has_optimizer=false).

    Copy-head parameters absent from `tensors` keep Megatron's fresh initialization (seeded by `seed`).
    """
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.model.builder import build_run, model_run

    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"output {root} exists and is not an empty directory; remove it or choose another")
    with single_process_megatron(model, seed, backend="gloo"):
        chunk = build_run(model_run(model, copy_head)).model
        fresh = fill_model(chunk, tensors)
        if fresh:
            log.info("copy head freshly initialized (Megatron init, seed %d): %s", seed, ", ".join(fresh))
        root.mkdir(parents=True, exist_ok=True)
        return Checkpointer(root, log=log.info).save([chunk], None, None, TrainState(), None, run_config)
