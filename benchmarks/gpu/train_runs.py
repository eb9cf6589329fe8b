"""Train a group of the GPU check's runs (benchmarks/gpu/runs.py) one after another in this one process, each as
`pretrain_cplm.py` would (`cplm_megatron.pretrain.main` with the recipe and the run's overrides), and copy each
run's record, resolved config, per-step metrics and profile to WORK_DIR/train_<group>_<name>.{json,yaml,metrics.jsonl,
profile.json} as it ends.

    python -m benchmarks.gpu.train_runs WORK_DIR GROUP [--slots SLOT,SLOT] [--dry-run]

On a GPU each run's micro-batch is the largest that divides its sequences per step and whose planner estimate,
times the margin measured on a GPU, fits the device's memory less a reserve (model/sizing/planner.py choose_micro_batch:
the 1.7B/4k slot trains micro-batch 4 on an H200, 2 on an H100); the choice and its figures go to
WORK_DIR/train_<group>_<name>.micro.json. The dry run keeps the shapes' micro-batches and runs the Triton kernels
in the interpreter (the fused LM-head loss).

A run that fails (an out-of-memory error, say) is reported and the next one trains; a stop signal (the step's
budget) stops the running run at its next step with its record (exit 75) and the rest are not started. Exit 0
when every run finished, 75 when stopped, 1 when a run failed.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import List, Optional

from benchmarks.gpu.runs import GROUPS, SHAPES, TrainRun, group_runs, overrides, run_stem, shape

RECIPE = "configs/smollm2_135m.yaml"
RECORDS = ("run_record.json", "run_record_stopped_early.json")
STOPPED = 75


def collect(work: Path, group: str, run: TrainRun, run_dir: Path) -> None:
    """The run's record, config and metrics -> WORK/train_<group>_<name>.*"""
    stem = work / run_stem(group, run)
    for record in RECORDS:
        if (run_dir / record).exists():
            shutil.copy(run_dir / record, f"{stem}.json")
            break
    for name, suffix in (("metrics.jsonl", ".metrics.jsonl"), ("config.yaml", ".yaml"), ("profile.json", ".profile.json")):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, f"{stem}{suffix}")


def release_memory() -> None:
    """What one run leaves behind, freed before the next (compiled graphs, cached blocks)."""
    import torch

    gc.collect()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def micro_batch_choice(run: TrainRun, device_gib: float, run_dir: str = "run"):
    """The planner's choice of the run's micro-batch on a device of `device_gib` (model/sizing/planner.py)."""
    from cplm_megatron.model.sizing.planner import choose_micro_batch
    from cplm_megatron.run_config import load_run_config
    from cplm_megatron.training.preflight import memory_needed

    def estimate(micro: int) -> float:  # `auto` estimated as Megatron's logits: the larger of its two paths
        cfg = load_run_config(RECIPE, overrides(run, False, run_dir, micro))
        if cfg.model.lm_head_loss == "auto":
            cfg = replace(cfg, model=replace(cfg.model, lm_head_loss="megatron"))
        return memory_needed(cfg, 1) / 2**30

    s = shape(run, dry_run=False)
    return choose_micro_batch(estimate, s.global_batch, s.micro_batch, device_gib)


def device_micro_batch(work: Path, group: str, run: TrainRun, run_dir: Path) -> Optional[int]:
    """The micro-batch this GPU holds for the run (None on CPU: the shape's), its figures -> WORK/<stem>.micro.json."""
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.cuda.get_device_properties(0).total_memory / 2**30
    choice = micro_batch_choice(run, device, str(run_dir))
    (work / f"{run_stem(group, run)}.micro.json").write_text(json.dumps(
        {"device_gib": device, "shape_micro_batch": shape(run, dry_run=False).micro_batch, **asdict(choice),
         "line": choice.line()}))
    print(f"[train_runs] {run.name}: {choice.line()}", flush=True)
    return choice.micro_batch


def train_group(work: Path, group: str, dry_run: bool, slots: Optional[List[str]] = None) -> int:
    """Every run of `group` (of `slots` only, if given); the exit code (0, 75 or 1)."""
    from cplm_megatron.pretrain import main as pretrain

    failed: List[str] = []
    for run in group_runs(group, slots):
        run_dir = work / "runs" / run_stem(group, run)
        start = time.time()
        print(f"[train_runs] {run.name}: start", flush=True)
        try:
            micro = None if dry_run else device_micro_batch(work, group, run, run_dir)
            code = pretrain(["--config", RECIPE, "--set", *overrides(run, dry_run, str(run_dir), micro)])
        except Exception as err:  # noqa: BLE001 - one run's failure (e.g. out of memory) must not end the group
            print(f"[train_runs] {run.name}: failed: {type(err).__name__}: {err}", flush=True)
            code = 1
        collect(work, group, run, run_dir)
        release_memory()
        print(f"[train_runs] {run.name}: exit {code} in {time.time() - start:.1f} s", flush=True)
        if code == STOPPED:
            return STOPPED
        if code != 0:
            failed.append(run.name)
    if failed:
        print(f"[train_runs] failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, help="the check's working directory")
    p.add_argument("group", choices=sorted(GROUPS))
    p.add_argument("--slots", help="comma-separated shape slots: only their runs (default: every run)")
    p.add_argument("--dry-run", action="store_true", help="the tiny preset at tiny sizes (CPU)")
    args = p.parse_args(argv)
    slots = args.slots.split(",") if args.slots else None
    unknown = sorted(set(slots or ()) - set(SHAPES))
    if unknown:
        p.error(f"--slots: unknown {unknown}; slots: {', '.join(SHAPES)}")
    if args.dry_run:  # before the Triton kernels are defined: the fused LM-head loss runs interpreted on CPU
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return train_group(args.work, args.group, args.dry_run, slots)


if __name__ == "__main__":
    sys.exit(main())
