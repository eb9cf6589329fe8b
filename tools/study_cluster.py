#!/usr/bin/env python
"""The recipe study on a SLURM cluster (cplm_megatron/experiments/study/cluster.py): submit it, then collect it.

  .venv/bin/python tools/study_cluster.py submit --output runs/study --scales 135m,360m --data /data/corpus \\
      [--seeds 1,2,3] [--arms baseline,aux1,...] [--iters 5000] [--sbatch-arg=--partition=h100] [--dry-run]
  .venv/bin/python tools/study_cluster.py collect --output runs/study

submit: two jobs per (scale, arm, seed) -- training through slurm/pretrain_<scale>.sh (requeued on exit 75 by
slurm/launch.sh, resuming from its checkpoint), then `python -m cplm_megatron.evaluate` after it succeeded -- and the estimated
GPU-hours; runs already evaluated are skipped, so submitting again continues a study. collect: summary.json,
report.md and plots from the evaluated runs, with the CPU study's decision rule (provisional until every planned
run is in).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on, quiet_known_warnings
from cplm_megatron.errors import UserError
from cplm_megatron.experiments.study.cluster import ClusterStudyError, ClusterStudySettings, collect, submit


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", help="submit every run of the study")
    s.add_argument("--output", type=Path, required=True, help="study directory (runs/, logs/, study.json)")
    s.add_argument("--data", required=True, help="prepared corpus with train/, dev/ and val/ splits")
    defaults = ClusterStudySettings()
    s.add_argument("--scales", type=_names, default=defaults.scales, help="slurm/pretrain_<scale>.sh: 135m,360m,1p7b")
    s.add_argument("--arms", type=_names, default=defaults.arms, help="default: every active arm")
    s.add_argument("--seeds", type=lambda t: tuple(int(x) for x in _names(t)), default=defaults.seeds)
    s.add_argument("--iters", type=int, default=defaults.iters, help="training steps per run")
    s.add_argument("--eval-interval", type=int, default=defaults.eval_interval, help="trainer validation interval")
    s.add_argument("--checkpoint-interval", type=int, default=defaults.checkpoint_interval)
    s.add_argument("--eval-limit", type=int, default=defaults.eval_limit, help="the evaluator's --limit")
    s.add_argument("--no-val-all", action="store_true",
                   help="val and the cache control score --eval-limit samples, not every one (a quick check only)")
    s.add_argument("--passkey-lengths", type=lambda t: tuple(int(x) for x in _names(t)),
                   default=defaults.passkey_lengths)
    s.add_argument("--time", default=defaults.time, help="sbatch --time of every job")
    s.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG", help="extra sbatch argument, every job")
    s.add_argument("--eval-sbatch-arg", action="append", default=None, metavar="ARG",
                   help=f"extra sbatch argument of the evaluation jobs (default {' '.join(defaults.eval_sbatch_args)})")
    s.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="training overrides applied after the study's")
    s.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    c = sub.add_parser("collect", help="aggregate the evaluated runs")
    c.add_argument("--output", type=Path, required=True)
    return p.parse_args(argv)


@exit_2_on(UserError, ClusterStudyError, FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    quiet_known_warnings()
    args = parse_args(argv)
    command = "tools/study_cluster.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.command == "collect":
        collect(args.output, command=command)
        return 0
    settings = ClusterStudySettings(
        scales=args.scales, arms=args.arms, seeds=args.seeds, data=args.data, iters=args.iters,
        eval_interval=args.eval_interval, checkpoint_interval=args.checkpoint_interval, eval_limit=args.eval_limit,
        val_all=not args.no_val_all,
        passkey_lengths=args.passkey_lengths, time=args.time, sbatch_args=tuple(args.sbatch_arg),
        eval_sbatch_args=(tuple(args.eval_sbatch_arg) if args.eval_sbatch_arg is not None
                          else ClusterStudySettings.eval_sbatch_args),
        sets=tuple(args.set), slurm_dir=str(Path(__file__).resolve().parents[1] / "slurm"))
    submit(settings, args.output, dry_run=args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
