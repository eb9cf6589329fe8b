"""Where a launch starts: resume this run, start from another checkpoint (`checkpoint.load`), or start fresh.

Decided from the files alone, on every rank, before any process group exists, so a refusal costs no
rendezvous and nothing is written before it:

* a run dir with checkpoints is resumed (from `latest`, or without it from the newest complete
  checkpoint, said out loud) and never overwritten by a fresh start; `checkpoint.resume=false` there is
  refused unless `checkpoint.overwrite=true` asks for its checkpoints to be deleted;
* `latest` moved back past newer intact checkpoints is refused (this run would replace them);
* the saved config is compared with the new one (`resume_compat`): must-match keys that differ are a
  ConfigError naming them, changeable ones are reported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from cplm_megatron.errors import CheckpointError, ConfigError
from cplm_megatron.training.checkpoint_lookup import (
    CHECKPOINTS_DIR,
    LATEST,
    CheckpointRef,
    checkpoint_damage,
    find_checkpoint,
    holds_checkpoints,
    iteration_of,
    list_checkpoints,
    read_saved_config,
    resolve_checkpoint,
)
from cplm_megatron.training.resume_compat import compare_configs, describe
from cplm_megatron.training.run_config import RunConfig


@dataclass
class StartPlan:
    """What a launch loads before its first step."""

    checkpoint: Optional[CheckpointRef] = None  # None: fresh initialization
    load_optimizer: bool = True  # also optimizer, scheduler, data position, iteration
    resumed: bool = False  # the checkpoint is this run's own (run.dir/checkpoints)
    delete_existing: bool = False  # checkpoint.overwrite=true: delete run.dir/checkpoints first
    notes: List[str] = field(default_factory=list)  # to print on rank 0


def _check_newer(root: Path, ref: CheckpointRef, notes: List[str]) -> None:
    """Refuse to resume behind intact newer checkpoints (they would be replaced as training reaches them)."""
    newer = [p for p in list_checkpoints(root) if iteration_of(p) > ref.iteration]
    intact = [p.name for p in newer if not checkpoint_damage(p)]
    if intact:
        raise CheckpointError(
            f"{root / LATEST} points at {ref.path.name}, but newer complete checkpoints exist ({', '.join(intact)}) "
            f"that this run would replace; continue from the newest with: echo {intact[-1]} > {root / LATEST}, "
            f"or move {', '.join(intact)} out of {root} to restart from {ref.path.name}")
    if newer:
        notes.append(f"[checkpoint] damaged newer checkpoints ({', '.join(p.name for p in newer)}) are replaced "
                     f"when this run saves those iterations")


def _compare(ref: CheckpointRef, cfg: RunConfig, weights_only: bool, how: str, notes: List[str]) -> None:
    mismatched, changed = compare_configs(read_saved_config(ref.path), cfg, weights_only=weights_only)
    if mismatched:
        raise ConfigError(
            f"cannot {how} {ref.path}: settings that define the model, its loss or its data differ from the "
            f"checkpoint's saved config ({describe(mismatched)}); restore them, or start a new run from these "
            f"weights with --set run.dir=NEW_DIR checkpoint.load={ref.path} checkpoint.load_optimizer=false")
    if changed:
        notes.append(f"[train] changed since {ref.path.name}: {describe(changed)}")


def plan_start(cfg: RunConfig) -> StartPlan:
    """Decide (and check) what this launch starts from; raises CheckpointError/ConfigError with the fix."""
    ckpt = cfg.checkpoint
    root = Path(cfg.run.dir) / CHECKPOINTS_DIR
    plan = StartPlan()
    if ckpt.resume:
        ref = find_checkpoint(root, say=plan.notes.append)
        if ref is not None:
            _check_newer(root, ref, plan.notes)
            _compare(ref, cfg, weights_only=False, how="resume from", notes=plan.notes)
            plan.checkpoint, plan.resumed = ref, True
            return plan
    elif holds_checkpoints(root):
        if not ckpt.overwrite:
            raise CheckpointError(
                f"checkpoint.resume=false but {root} holds checkpoints of an earlier run; resume them (drop "
                f"checkpoint.resume=false), choose a new run.dir, or delete them with --set checkpoint.overwrite=true")
        plan.delete_existing = True
        plan.notes.append(f"[checkpoint] checkpoint.overwrite=true: deleted the checkpoints in {root}")
    if ckpt.load:
        ref = resolve_checkpoint(Path(ckpt.load), say=plan.notes.append)
        weights_only = not ckpt.load_optimizer
        _compare(ref, cfg, weights_only=weights_only, how="start from", notes=plan.notes)
        plan.checkpoint, plan.load_optimizer = ref, ckpt.load_optimizer
    return plan
