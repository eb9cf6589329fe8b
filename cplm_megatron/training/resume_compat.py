"""Which settings may change when a run continues from a checkpoint, and which must match its saved config.

Every key must match unless it is listed below, so a key added later defaults to "must match". A key
missing from an older checkpoint's saved config counts as its default, so old checkpoints stay resumable.

* Resuming the same run (or continuing another run with its optimizer, `checkpoint.load` +
  `load_optimizer=true`): the keys in `RESUME_CHANGEABLE` may change and are reported; everything else
  (the architecture, the copy head, the loss, the data format and order, the precision and the optimizer
  state's format) must match.
* Starting from another run's weights only (`checkpoint.load` + `load_optimizer=false`, fine-tuning):
  only the `model.*` and `copy_head.*` keys that decide which tensors exist and their shapes must match
  (`WEIGHTS_ONLY_CHANGEABLE` lists what else in those sections may change).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Tuple

from cplm_megatron.config.loader import to_dict

ALL = "*"

# Keys that may differ from the checkpoint's config when resuming; ALL: the whole section.
RESUME_CHANGEABLE: Dict[str, Any] = {
    "run": ALL,  # dir, name, seed (seeds only the initialization, which a resume replaces)
    "parallel": ALL,  # checkpoints reshard to any TP/PP/DP layout
    "recompute": ALL,  # activation recomputation: same math
    "logging": ALL,
    "checkpoint": ALL,
    "schedule": ALL,  # the LR scheduler follows the new values (build_scheduler overrides the saved ones)
    "train": {"iters", "tokens", "micro_batch", "global_batch", "lr", "min_lr", "log_interval", "eval_interval",
              "eval_iters", "max_nonfinite_steps", "exit_after_iters", "profile_steps", "probe_interval",
              "probe_sequences", "probe_copy_length"},  # probes read the model, they change no step
    # beta1/beta2/eps are restored from the optimizer state, `distributed` decides its format: must match
    "optimizer": {"weight_decay", "clip_grad", "overlap_grad_reduce", "overlap_param_gather", "bucket_size",
                  "fused"},  # fused: the same update, another kernel (the state loads into either)
    # the data loader refuses a resume position that no longer fits the streams (epoch size, seed, tokenizer)
    "data": {"streams", "val_streams", "num_workers", "cache_dir", "verify_shards", "epoch_size"},
    # + same maths, other kernel (attention, the LM-head loss path: `auto` may resolve otherwise on another machine)
    "model": {"preset", "default_tp", "default_pp", "init_method_std", "attention_impl", "lm_head_loss", "compile",
              "fused_swiglu"},
    "copy_head": {"impl", "block_size", "fp8", "gate_bias_init"},  # same math, another kernel; init only
}

# With weights only, these sections are compared (all other sections may change freely) ...
WEIGHTS_ONLY_SECTIONS = ("model", "copy_head")
# ... except these keys, which change no tensor: fine-tuning may change them.
WEIGHTS_ONLY_CHANGEABLE: Dict[str, Any] = {
    "model": RESUME_CHANGEABLE["model"] | {"rope_theta", "norm_eps", "max_position_embeddings", "layer_spec"},
    "copy_head": RESUME_CHANGEABLE["copy_head"] | {"norm_eps", "lm_loss_weight", "copy_loss_weight", "decouple_lm"},
}

Change = Tuple[str, Any, Any]  # (dotted key, saved value, new value)


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return to_dict(field.default)
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return to_dict(field.default_factory())  # type: ignore[misc]
    return None


def _changeable(table: Mapping[str, Any], section: str, key: str) -> bool:
    allowed = table.get(section, ())
    return allowed == ALL or key in allowed


def compare_configs(saved: Mapping[str, Any], current: Any, weights_only: bool = False) -> Tuple[List[Change], List[Change]]:
    """(must-match keys that differ, changeable keys that differ) between a checkpoint's saved config (a
    dict) and the current RunConfig. Keys the saved config lacks count as their current default."""
    current_tree = current.to_dict()
    table = WEIGHTS_ONLY_CHANGEABLE if weights_only else RESUME_CHANGEABLE
    mismatched: List[Change] = []
    changed: List[Change] = []
    for section in dataclasses.fields(current):
        name = section.name
        if weights_only and name not in WEIGHTS_ONLY_SECTIONS:
            continue
        saved_section = saved.get(name) if isinstance(saved.get(name), Mapping) else {}
        new_section = current_tree.get(name, {})
        for field in dataclasses.fields(getattr(current, name)):
            old = saved_section.get(field.name, _field_default(field))
            new = new_section[field.name]
            if old == new:
                continue
            change = (f"{name}.{field.name}", old, new)
            (changed if _changeable(table, name, field.name) else mismatched).append(change)
    return mismatched, changed


def describe(changes: List[Change]) -> str:
    """'a.b: 1 -> 2, c.d: x -> y' for messages."""
    return ", ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
