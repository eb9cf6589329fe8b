"""Where a launch starts: resume this run, start from another checkpoint (`checkpoint.load`), or start fresh.

Decided from the files alone, on every rank, before any process group exists, so a refusal costs no
rendezvous and nothing is written before it:

* a run dir with checkpoints is resumed (from `latest`, or without it from the newest complete
  checkpoint, said out loud) and never overwritten by a fresh start; `checkpoint.resume=false` there is
  refused unless `checkpoint.overwrite=true` asks for its checkpoints to be deleted;
* a committed checkpoint newer than `latest` (the run stopped after the save committed, before `latest`
  moved: `latest` still equals the trainer's own record `latest.trainer`) is resumed from, said out loud;
* `latest` moved back by a person (it points older than `latest.trainer`) is honoured: the newer
  checkpoints are moved aside to `checkpoints/set_aside_<time>/` (never deleted) once every check passed;
  without a `latest.trainer` record (older runs) the two cannot be told apart and the launch is refused;
* the saved config is compared with the new one (`resume_compat`): must-match keys that differ are a
  ConfigError naming them, changeable ones are reported.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from cplm_megatron.checkpoint.lookup import (
    CHECKPOINTS_DIR,
    LATEST,
    SET_ASIDE_PREFIX,
    TRAINER_LATEST,
    CheckpointRef,
    checkpoint_damage,
    find_checkpoint,
    holds_checkpoints,
    iteration_of,
    list_checkpoints,
    read_saved_config,
    resolve_checkpoint,
    trainer_latest,
    verify_checkpoint,
)
from cplm_megatron.errors import CheckpointError, ConfigError
from cplm_megatron.run_config import RunConfig
from cplm_megatron.training.resume_compat import compare_configs, describe


@dataclass
class StartPlan:
    """What a launch loads before its first step."""

    checkpoint: Optional[CheckpointRef] = None  # None: fresh initialization
    load_optimizer: bool = True  # also optimizer, scheduler, data position, iteration
    resumed: bool = False  # the checkpoint is this run's own (run.dir/checkpoints)
    delete_existing: bool = False  # checkpoint.overwrite=true: delete run.dir/checkpoints first
    set_aside: List[Path] = field(default_factory=list)  # a rollback: move these newer checkpoints aside
    notes: List[str] = field(default_factory=list)  # to print on rank 0


def _check_newer(root: Path, ref: CheckpointRef, plan: StartPlan) -> CheckpointRef:
    """The checkpoint to resume when committed checkpoints newer than `latest` exist (see the module doc)."""
    newer = [p for p in list_checkpoints(root) if iteration_of(p) > ref.iteration]
    if not newer:
        return ref
    intact = [p for p in newer if not checkpoint_damage(p)]
    recorded = trainer_latest(root)
    names = ", ".join(p.name for p in newer)
    if recorded is not None and recorded > ref.iteration:  # a person moved `latest` back: a rollback
        plan.set_aside = newer
        plan.notes.append(f"[checkpoint] {root / LATEST} was moved back to {ref.path.name} (the trainer last set it "
                          f"to iter_{recorded:07d}): resuming from {ref.path.name}; the newer checkpoints ({names}) "
                          f"are kept in {root}/{SET_ASIDE_PREFIX}<time>/ (move them back to undo)")
        return ref
    if recorded == ref.iteration and intact:  # stopped after a save committed, before `latest` moved
        chosen = verify_checkpoint(intact[-1])
        plan.notes.append(f"[checkpoint] {chosen.path.name} is complete but newer than {root / LATEST} "
                          f"({ref.path.name}): the run stopped before moving latest; resuming from {chosen.path.name}")
        damaged = [p.name for p in newer if iteration_of(p) > chosen.iteration]
        if damaged:
            plan.notes.append(f"[checkpoint] damaged newer checkpoints ({', '.join(damaged)}) are replaced when "
                              f"this run saves those iterations")
        return chosen
    if intact:
        raise CheckpointError(
            f"{root / LATEST} points at {ref.path.name}, but newer complete checkpoints exist "
            f"({', '.join(p.name for p in intact)}) and no {TRAINER_LATEST} record says who moved latest, so "
            f"this run would replace them; continue from the newest with: echo {intact[-1].name} > {root / LATEST}, "
            f"or move {', '.join(p.name for p in intact)} out of {root} to restart from {ref.path.name}")
    plan.notes.append(f"[checkpoint] damaged newer checkpoints ({names}) are replaced "
                      f"when this run saves those iterations")
    return ref


def _compare(ref: CheckpointRef, cfg: RunConfig, weights_only: bool, how: str, notes: List[str]) -> None:
    saved = read_saved_config(ref.path)
    mismatched, changed = compare_configs(saved, cfg, weights_only=weights_only)
    if mismatched:
        shapes, _ = compare_configs(saved, cfg, weights_only=True)
        other = (f"or train this model from scratch in a new run dir (--set run.dir=NEW_DIR): its tensors differ from "
                 f"the checkpoint's ({describe(shapes)}), so no checkpoint.load can take them" if shapes else
                 f"or start a new run from these weights with --set run.dir=NEW_DIR checkpoint.load={ref.path} "
                 f"checkpoint.load_optimizer=false")
        raise ConfigError(
            f"cannot {how} {ref.path}: settings that define the model, its loss or its data differ from the "
            f"checkpoint's saved config ({describe(mismatched)}); restore them, {other}")
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
            ref = _check_newer(root, ref, plan)
            _compare(ref, cfg, weights_only=False, how="resume from", notes=plan.notes)
            plan.checkpoint, plan.resumed = ref, True
            return plan
    elif holds_checkpoints(root):
        if not ckpt.overwrite:
            raise CheckpointError(
                f"checkpoint.resume=false but {root} holds checkpoints of an earlier run; resume them (drop "
                f"checkpoint.resume=false), choose a new run.dir, or delete them with --set checkpoint.overwrite=true")
        plan.delete_existing = True
        plan.notes.append(f"[checkpoint] checkpoint.overwrite=true: deleted the checkpoints in {root} (every check "
                          f"passed)")
    if ckpt.load:
        ref = resolve_checkpoint(Path(ckpt.load), say=plan.notes.append)
        if plan.delete_existing and root.resolve() in ref.path.resolve().parents:
            raise ConfigError(f"checkpoint.load={ckpt.load} is inside {root}, which checkpoint.overwrite=true "
                              f"deletes; copy it elsewhere first or drop checkpoint.overwrite")
        weights_only = not ckpt.load_optimizer
        _compare(ref, cfg, weights_only=weights_only, how="start from", notes=plan.notes)
        plan.checkpoint, plan.load_optimizer = ref, ckpt.load_optimizer
    return plan


def apply_plan(plan: StartPlan, root: Path) -> None:
    """Rank 0, once every check passed: delete the checkpoints (checkpoint.overwrite=true) or move the
    checkpoints newer than a rolled-back `latest` to `root/set_aside_<time>/` (renamed, never deleted)."""
    if plan.delete_existing and root.exists():
        shutil.rmtree(root)
    if plan.set_aside:
        aside = root / f"{SET_ASIDE_PREFIX}{time.strftime('%Y%m%dT%H%M%S')}"
        n = 1
        while aside.exists():
            n += 1
            aside = root / f"{SET_ASIDE_PREFIX}{time.strftime('%Y%m%dT%H%M%S')}_{n}"
        aside.mkdir()
        for path in plan.set_aside:
            path.rename(aside / path.name)
        print(f"[checkpoint] moved {', '.join(p.name for p in plan.set_aside)} to {aside}", flush=True)
