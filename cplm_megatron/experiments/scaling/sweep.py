"""The scaling sweep (CLI: tools/scaling_study.py): one sbatch job per model size x node count x parallel layout x
copy head.

  .venv/bin/python tools/scaling_study.py --output runs/scaling/h100 --sizes 1p7b 7b --nodes 1 2 4 8 \\
      --layouts tp1pp1 tp2pp1sp --copy-head on off --iters 50 [--wait]

Each job is slurm/pretrain_<size>.sh (its recipe and #SBATCH directives) with --nodes, --exclusive
(so runs never share a node) and a short --time, and these overrides: run.dir=<output>/runs/<name>,
the layout (parallel.tp/pp/vpp/sp), copy_head.enabled, train.iters (tokens unset), no periodic
evaluation or checkpoints; then your own --set overrides. At the end each run writes
<run.dir>/run_record.json (layout, tokens/s, TFLOP/s, MFU, step time, peak memory, config hash): the
study's records. <output>/study.json lists the jobs; combinations whose record exists are not
resubmitted. Aggregate with:
  .venv/bin/python tools/scaling_report.py <output>/runs --output <output>/report

Layouts are written tp<N>pp<M>[vpp<K>][sp], e.g. tp1pp1, tp2pp1sp, tp4pp2vpp4sp.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cplm_megatron.experiments.launch.launcher import sbatch
from cplm_megatron.experiments.scaling.plan import (
    DEFAULT_TASKS_PER_NODE,
    SIZES,
    Combination,
    StudyError,
    SweepLayout,
    plan,
    recipe_layout,
)
from cplm_megatron.training.run_record import has_run_record


def sbatch_command(combo: Combination, output: Path, args: argparse.Namespace, dependency: str | None,
                   slurm_dir: Path) -> list[str]:
    """The sbatch command line submitting one combination: its size's script with the run's `--set` arguments."""
    from cplm_megatron.experiments.launch.launcher import train_command

    cmd = ["sbatch", "--parsable", f"--job-name=scal-{combo.name}", f"--nodes={combo.nodes}",
           f"--time={args.time}", f"--output={output / 'logs'}/%x-%j.out"]
    if args.ntasks_per_node:
        cmd.append(f"--ntasks-per-node={args.ntasks_per_node}")
    if not args.shared:
        cmd.append("--exclusive")
    if dependency:
        cmd.append(f"--dependency=afterany:{dependency}")
    cmd += args.sbatch_arg or []
    cmd.append(str(combo.script(slurm_dir)))
    run = combo.run(args.iters, args.set or [])
    return cmd + list(train_command(run, output / "runs" / combo.name).argv[2:])  # the script holds the recipe


def wait_for_jobs(job_ids: Sequence[str], poll_seconds: float) -> None:
    """Block until none of `job_ids` is queued or running; prints progress as jobs finish."""
    pending = set(job_ids)
    start = time.monotonic()
    while pending:
        listed = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
        pending &= set(listed.stdout.split())
        elapsed = datetime.timedelta(seconds=int(time.monotonic() - start))
        print(f"[scaling_study] {len(job_ids) - len(pending)}/{len(job_ids)} jobs finished ({elapsed})", flush=True)
        if pending:
            time.sleep(poll_seconds)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, required=True, help="study directory (runs/, logs/, study.json)")
    p.add_argument("--sizes", nargs="+", choices=SIZES, required=True, help="model sizes (slurm/pretrain_<size>.sh)")
    p.add_argument("--nodes", nargs="+", type=int, required=True, help="node counts")
    p.add_argument("--layouts", nargs="+", default=None,
                   help="parallel layouts tp<N>pp<M>[vpp<K>][sp] for every size (default: each recipe's own)")
    p.add_argument("--copy-head", nargs="+", choices=("on", "off"), default=["on", "off"])
    p.add_argument("--iters", type=int, default=50, help="training iterations per run (default 50)")
    p.add_argument("--time", default="00:30:00", help="sbatch --time per run (default 00:30:00)")
    p.add_argument("--ntasks-per-node", type=int, default=None,
                   help=f"override the scripts' tasks per node ({DEFAULT_TASKS_PER_NODE})")
    p.add_argument("--sbatch-arg", action="append", metavar="ARG",
                   help="extra sbatch argument, repeatable (e.g. --sbatch-arg=--partition=h100)")
    p.add_argument("--set", nargs="+", action="extend", metavar="KEY=VALUE",
                   help="training overrides applied after the study's (e.g. data.streams=...)")
    p.add_argument("--chain", action="store_true", help="run one job at a time (--dependency=afterany on the previous)")
    p.add_argument("--shared", action="store_true", help="do not request --exclusive nodes")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    p.add_argument("--wait", action="store_true", help="wait for the jobs and check every run wrote its record")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between queue checks with --wait")
    return p.parse_args(argv)


def run_sweep(argv: Sequence[str] | None, slurm_dir: Path) -> int:
    """Plan, submit (or print with --dry-run) and optionally wait for the sweep; `slurm_dir`: the checkout's slurm/."""
    return submit_sweep(parse_args(argv), slurm_dir)


def sweep_plan(args: argparse.Namespace, slurm_dir: Path) -> tuple[list[Combination], list[tuple[Combination, str]]]:
    """The sweep's combinations and the ones skipped (with why) of the parsed options; StudyError for bad ones."""
    if any(n < 1 for n in args.nodes) or args.iters < 1:
        raise StudyError(f"--nodes and --iters must be >= 1 (got nodes {args.nodes}, iters {args.iters})")
    sizes = list(dict.fromkeys(args.sizes))
    if args.layouts:
        chosen = list(dict.fromkeys(SweepLayout.parse(t) for t in args.layouts))
        layouts = {size: chosen for size in sizes}
    else:
        layouts = {size: [recipe_layout(size, slurm_dir)] for size in sizes}
    heads = [h == "on" for h in dict.fromkeys(args.copy_head)]
    return plan(layouts, sorted(set(args.nodes)), heads, args.ntasks_per_node or DEFAULT_TASKS_PER_NODE)


def submit_sweep(args: argparse.Namespace, slurm_dir: Path) -> int:
    """Submit (or print with --dry-run) the sweep's jobs and optionally wait for them; the exit code."""
    combos, skipped = sweep_plan(args, slurm_dir)
    for combo, why in skipped:
        print(f"[scaling_study] skip {combo.name}: {why}")
    output = args.output.resolve()
    jobs: list[dict[str, object]] = []
    previous = None
    for combo in combos:
        run_dir = output / "runs" / combo.name
        if has_run_record(run_dir):
            print(f"[scaling_study] {combo.name}: record exists, not resubmitted")
            continue
        cmd = sbatch_command(combo, output, args, previous if args.chain else None, slurm_dir)
        if args.dry_run:
            print(" ".join(cmd))
            continue
        (output / "logs").mkdir(parents=True, exist_ok=True)
        previous = sbatch(cmd, Path(slurm_dir).resolve().parent, StudyError)
        print(f"[scaling_study] submitted {combo.name}: job {previous}", flush=True)
        jobs.append({"name": combo.name, "size": combo.size, "nodes": combo.nodes, "layout": combo.layout.name,
                     "copy_head": combo.copy_head, "job_id": previous, "run_dir": str(run_dir),
                     "log": str(output / "logs" / f"scal-{combo.name}-{previous}.out"), "command": cmd})
        (output / "study.json").write_text(json.dumps(
            {"created": datetime.datetime.now().isoformat(timespec="seconds"), "iters": args.iters,
             "jobs": jobs, "skipped": [{"name": c.name, "reason": why} for c, why in skipped]}, indent=2))
    if args.dry_run or not jobs:
        return 0
    print(f"[scaling_study] {len(jobs)} jobs; report: .venv/bin/python tools/scaling_report.py "
          f"{output / 'runs'} --output {output / 'report'}")
    if not args.wait:
        return 0
    wait_for_jobs([str(j["job_id"]) for j in jobs], args.poll)
    missing = [j for j in jobs if not has_run_record(Path(str(j["run_dir"])))]
    for j in missing:
        print(f"[scaling_study] {j['name']} (job {j['job_id']}) wrote no record; see {j['log']}", file=sys.stderr)
    return 1 if missing else 0
