"""The scaling sweep as a registered experiment (registry.py): one SLURM job per model size x node count x parallel
layout x copy head, and the report of their run records. Its settings are the sweep's options (sweep.parse_args)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.registry import Context, Experiment

SLURM = Path(__file__).resolve().parents[3] / "slurm"  # the checkout's job scripts (slurm/pretrain_<size>.sh)


def plan(settings: argparse.Namespace, ctx: Context) -> list:
    """The sweep's combinations (the skipped ones left out)."""
    from cplm_megatron.experiments.scaling.sweep import sweep_plan

    return sweep_plan(settings, SLURM)[0]


def run(settings: argparse.Namespace, ctx: Context) -> int:
    """Submit the jobs (runs with a record are not resubmitted); the exit code."""
    from cplm_megatron.experiments.scaling.sweep import submit_sweep

    return submit_sweep(settings, SLURM)


def report(settings: argparse.Namespace, ctx: Context) -> Any:
    """report.md and the plots of the records under OUTPUT/runs, in OUTPUT/report."""
    from cplm_megatron.experiments.scaling.report import write_report

    return write_report([Path(ctx.output) / "runs"], Path(ctx.output) / "report")


def main(argv: list[str] | None = None) -> int:
    """tools/scaling_study.py's command line."""
    from cplm_megatron.entry_points import exit_2_on
    from cplm_megatron.experiments.scaling.plan import StudyError
    from cplm_megatron.experiments.scaling.sweep import run_sweep

    return exit_2_on(StudyError)(lambda args: run_sweep(args, SLURM))(argv)


EXPERIMENT = Experiment("scaling", "throughput and scaling efficiency over sizes, nodes and layouts on SLURM "
                        "(tools/scaling_study.py)", argparse.Namespace, plan=plan, run=run, report=report, main=main)
