#!/usr/bin/env python
"""Submit a scaling study (cplm_megatron/experiments/scaling/sweep.py): one sbatch job per model size x node count
x parallel layout x copy head, through this checkout's slurm/pretrain_<size>.sh.

  .venv/bin/python tools/scaling_study.py --output runs/scaling/h100 --sizes 1p7b 7b --nodes 1 2 4 8 \\
      --layouts tp1pp1 tp2pp1sp --copy-head on off --iters 50 [--wait]
  .venv/bin/python tools/scaling_report.py runs/scaling/h100/runs --output runs/scaling/h100/report

`--help` lists the options; layouts are written tp<N>pp<M>[vpp<K>][sp], e.g. tp1pp1, tp2pp1sp, tp4pp2vpp4sp.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.experiments.scaling import plan as grid
from cplm_megatron.experiments.scaling import sweep
from cplm_megatron.experiments.scaling.plan import Combination, StudyError, SweepLayout, plan  # noqa: F401
from cplm_megatron.experiments.scaling.sweep import parse_args  # noqa: F401 - the tool's interface

SLURM = Path(__file__).resolve().parents[1] / "slurm"


def recipe_layout(size: str) -> SweepLayout:
    """The parallel layout of the recipe slurm/pretrain_<size>.sh runs."""
    return grid.recipe_layout(size, SLURM)


def sbatch_command(combo: Combination, output: Path, args, dependency: str | None) -> list[str]:
    """The sbatch command line submitting one combination."""
    return sweep.sbatch_command(combo, output, args, dependency, SLURM)


@exit_2_on(StudyError)
def main(argv: Sequence[str] | None = None) -> int:
    return sweep.run_sweep(argv, SLURM)


if __name__ == "__main__":
    sys.exit(main())
