"""Weight mapping between full (unsharded) Megatron-Core tensors and Hugging Face state dicts.

Megatron side: the global tensors of a torch_dist checkpoint by sharded key, transformer layers stacked on
dim 0 (what `read_tensors` returns); their layout is described in cplm_megatron/model/backbones/base.py.
Each family's tensors map through its backbone spec (`to_hf` / `from_hf`); the copy head's tensors are named
alike on both sides and are handled here. (Megatron's softmax also covers the padded vocabulary rows, HF's only
the real ones; the distributions agree when the padded logits carry no mass.)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from cplm_megatron.hf.config_mapping import ConversionError, check_exportable
from cplm_megatron.model.backbones import backbone
from cplm_megatron.model.backbones.base import (  # noqa: F401 - re-exported: the converters' names
    EMBEDDING,
    FC1,
    FC2,
    FINAL_NORM,
    INPUT_NORM,
    MLP_NORM,
    OUTPUT_LAYER,
    POSITIONS,
    PROJ,
    QKV,
    HFState,
    checked,
    merge_qkv,
    split_qkv,
)
from cplm_megatron.model.config import ModelConfig
from cplm_megatron.model.copy_head import CopyHeadConfig
from cplm_megatron.model.mixing import mixing_rule

COPY_HEAD = "copy_head."


def copy_head_keys(copy_head: CopyHeadConfig) -> list[str]:
    """Parameter names of the copy head (identical on both sides)."""
    names = ["q_proj.weight", "k_proj.weight", "gate.weight", "gate.bias"]
    if copy_head.qk_norm:
        names += ["q_norm.weight", "k_norm.weight"]
    return [COPY_HEAD + name for name in names]


def megatron_keys(model: ModelConfig, copy_head: CopyHeadConfig | None) -> list[str]:
    """The Megatron tensors a checkpoint of this model holds (optimizer state aside)."""
    keys = backbone(model.family).megatron_keys(model)
    return keys + (copy_head_keys(copy_head) if copy_head is not None else [])


def megatron_to_hf(
    tensors: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig | None
) -> dict[str, torch.Tensor]:
    """HF state dict (the family's names, + the CPLM copy head) of a Megatron checkpoint's full tensors."""
    check_exportable(model, copy_head)
    state = backbone(model.family).to_hf(tensors, model)
    if copy_head is not None:
        state.update(_copy_head_tensors(tensors, model, copy_head))
    return state


def _copy_head_tensors(
    tensors: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig
) -> dict[str, torch.Tensor]:
    width = copy_head.heads * copy_head.head_dim
    rows = mixing_rule(copy_head.mixing).gate_rows(copy_head.heads)  # 1, or H_c sentinels (mixing: sentinel)
    shapes = {"q_proj.weight": (width, model.hidden_size), "k_proj.weight": (width, model.hidden_size),
              "gate.weight": (rows, model.hidden_size), "gate.bias": (rows,),
              "q_norm.weight": (copy_head.head_dim,), "k_norm.weight": (copy_head.head_dim,)}
    return {key: checked(tensors, key, shapes[key.removeprefix(COPY_HEAD)]) for key in copy_head_keys(copy_head)}


def hf_to_megatron(
    state: Mapping[str, torch.Tensor], model: ModelConfig, copy_head: CopyHeadConfig | None
) -> dict[str, torch.Tensor]:
    """Full Megatron tensors of an HF state dict of the model's family.

    With `copy_head`, the state's `copy_head.*` tensors are taken (an HF CPLM checkpoint); without,
    any `copy_head.*` tensors are dropped. A tied checkpoint's `lm_head.weight` is ignored.
    """
    check_exportable(model, None)
    spec = backbone(model.family)
    hf_state = HFState(state)
    tensors = spec.from_hf(hf_state, model)
    if copy_head is not None:
        head = _copy_head_tensors(state, model, copy_head)
        hf_state.used.update(head)
        tensors.update(head)
    else:
        hf_state.used.update(key for key in state if key.startswith(COPY_HEAD))
    unexpected = hf_state.unused()
    if unexpected:
        raise ConversionError(f"HF state dict has tensors the {spec.family} mapping does not know: {unexpected[:10]}"
                              + (f" ... and {len(unexpected) - 10} more" if len(unexpected) > 10 else ""))
    return tensors
