"""Train a group of the GPU check's runs (benchmarks/gpu/runs.py) one after another in this one process, each as
`pretrain_cplm.py` would (`cplm_megatron.pretrain.main` with the recipe and the run's overrides), and copy each
run's record, resolved config, per-step metrics and profile to WORK_DIR/train_<group>_<name>.{json,yaml,metrics.jsonl,
profile.json} as it ends.

    python benchmarks/gpu/train_runs.py WORK_DIR GROUP [--dry-run]

A run that fails (an out-of-memory error, say) is reported and the next one trains; a stop signal (the step's
budget) stops the running run at its next step with its record (exit 75) and the rest are not started. Exit 0
when every run finished, 75 when stopped, 1 when a run failed.
"""
from __future__ import annotations

import argparse
import gc
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import GROUPS, TrainRun, group_runs, overrides, run_stem  # noqa: E402 - beside this script

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


def train_group(work: Path, group: str, dry_run: bool) -> int:
    """Every run of `group`; the exit code (0, 75 or 1)."""
    from cplm_megatron.pretrain import main as pretrain

    failed: List[str] = []
    for run in group_runs(group):
        run_dir = work / "runs" / run_stem(group, run)
        start = time.time()
        print(f"[train_runs] {run.name}: start", flush=True)
        try:
            code = pretrain(["--config", RECIPE, "--set", *overrides(run, dry_run, str(run_dir))])
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
    p.add_argument("--dry-run", action="store_true", help="the tiny preset at tiny sizes (CPU)")
    args = p.parse_args(argv)
    return train_group(args.work, args.group, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
