"""The long-context comparison as a registered experiment (registry.py). Its settings are benchmarks/long_context.py's
options (comparison.parse_args; `settings()` gives the defaults); the runs go under OUTPUT/runs, the results
JSON and plot in OUTPUT."""
from __future__ import annotations

import argparse
from pathlib import Path

from cplm_megatron.experiments.registry import Context, Experiment


def defaults() -> argparse.Namespace:
    """benchmarks/long_context.py's defaults: CP=2 at 8k, scored at 4k-32k."""
    from cplm_megatron.experiments.long_context.comparison import parse_args

    return parse_args([])


def placed(settings: argparse.Namespace, ctx: Context) -> argparse.Namespace:
    """The settings with the run dirs under OUTPUT/runs and the results in OUTPUT."""
    return argparse.Namespace(**{**vars(settings), "runs": Path(ctx.output) / "runs", "out": Path(ctx.output)})


def plan(settings: argparse.Namespace, ctx: Context) -> list[str]:
    """Every phase's run dir, model by model (the short phase first)."""
    from cplm_megatron.experiments.long_context.comparison import MODELS, phases

    return [str(run_dir) for name in MODELS for _, run_dir in phases(placed(settings, ctx), name)]


def run(settings: argparse.Namespace, ctx: Context) -> Path:
    """Train what has not finished, score both models by length; the results JSON."""
    from cplm_megatron.experiments.long_context.comparison import run_comparison

    return run_comparison(placed(settings, ctx), ctx.command)


def report(settings: argparse.Namespace, ctx: Context) -> Path:
    """Score the finished models by length (FileNotFoundError naming a phase not finished); the results JSON."""
    from cplm_megatron.experiments.long_context.comparison import run_comparison

    return run_comparison(placed(settings, ctx), ctx.command, train_runs=False)


def main(argv: list[str] | None = None) -> int:
    """benchmarks/long_context.py's command line."""
    from cplm_megatron.experiments.long_context.comparison import main as comparison_main

    return comparison_main(argv)


class LongContextSettings(argparse.Namespace):
    """benchmarks/long_context.py's options; the type's defaults are the benchmark's."""

    def __init__(self, **changes: object):
        super().__init__(**{**vars(defaults()), **changes})


EXPERIMENT = Experiment("long_context", "passkey and copy accuracy by context length after CP training at one "
                        "length (benchmarks/long_context.py)", LongContextSettings, plan=plan, run=run, report=report,
                        main=main)
