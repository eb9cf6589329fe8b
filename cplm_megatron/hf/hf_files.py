"""Read a local Hugging Face checkpoint directory (config.json + weights) without remote code.

The config class is chosen from `model_type` (CPLM directories use our own CPLMConfig, so no
`trust_remote_code` is needed); weights come from model.safetensors, its sharded index, or
pytorch_model.bin.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, PretrainedConfig

from cplm_megatron.hf.config_mapping import ConversionError
from cplm_megatron.hf.configuration_cplm import CPLMConfig
from cplm_megatron.hf.export import TOKENIZER_FILES

CONFIG_FILE = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"


def read_hf_config(hf_dir: str | Path) -> PretrainedConfig:
    """The config of a local HF checkpoint (any model type transformers knows, plus cplm)."""
    path = Path(hf_dir) / CONFIG_FILE
    if not path.is_file():
        if (Path(hf_dir) / "checkpoints").is_dir() or (Path(hf_dir) / "cplm_state.json").is_file() \
                or Path(hf_dir).name == "checkpoints":
            raise ConversionError(f"{hf_dir} is a Megatron training checkpoint, not a Hugging Face directory: export it "
                                  f"with tools/convert_to_hf.py --checkpoint {hf_dir} --output DIR")
        raise ConversionError(f"{path} not found: --hf must be a local Hugging Face checkpoint directory")
    try:
        config_dict = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConversionError(f"{path} is not valid JSON: {err}") from err
    model_type = config_dict.get("model_type")
    if model_type == CPLMConfig.model_type:
        return CPLMConfig.from_dict(config_dict)
    try:
        return AutoConfig.for_model(model_type, **{k: v for k, v in config_dict.items() if k != "model_type"})
    except (ValueError, KeyError) as err:
        raise ConversionError(f"unsupported architecture in {path}: model_type={model_type!r} is unknown to "
                              f"transformers ({err})") from err


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one .safetensors file; a truncated or damaged one is a ConversionError naming it."""
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise ConversionError(f"{path} is not a complete safetensors file ({err}): it is truncated or damaged (an "
                              f"interrupted download or copy?); download or copy it again") from None


def read_hf_state_dict(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a local HF checkpoint's weight files, by name."""
    hf_dir = Path(hf_dir)
    if (hf_dir / SAFETENSORS).is_file():
        return _load_safetensors(hf_dir / SAFETENSORS)
    if (hf_dir / SAFETENSORS_INDEX).is_file():
        index = json.loads((hf_dir / SAFETENSORS_INDEX).read_text())
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            if not (hf_dir / shard).is_file():
                raise ConversionError(f"{hf_dir / shard} (listed in {SAFETENSORS_INDEX}) is missing")
            state.update(_load_safetensors(hf_dir / shard))
        return state
    if (hf_dir / TORCH_BIN).is_file():
        return torch.load(hf_dir / TORCH_BIN, map_location="cpu", weights_only=True)
    raise ConversionError(f"no weights in {hf_dir}: expected {SAFETENSORS}, {SAFETENSORS_INDEX} (+ shards) or "
                          f"{TORCH_BIN}")


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of `src` into a new directory `dst`; returns the names copied."""
    names = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if names:
        dst.mkdir(parents=True)
        for name in names:
            shutil.copyfile(src / name, dst / name)
    return names
