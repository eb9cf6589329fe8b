"""The emergence study as a registered experiment (registry.py): does the copy head still help once the baseline
copies?"""
from __future__ import annotations

from typing import Any

from cplm_megatron.experiments.emergence.plan import EmergenceSettings, corpus_dirs, emergence_runs
from cplm_megatron.experiments.registry import Context, Experiment


def run(settings: EmergenceSettings, ctx: Context) -> Any:
    """Train and evaluate the grid (finished runs reused; corpora built under ctx.data when missing), report."""
    from cplm_megatron.experiments.emergence.study import run_emergence

    return run_emergence(ctx.output, settings, ctx.data, None, ctx.jobs, ctx.command, ctx.on_done, ctx.log)


def report(settings: EmergenceSettings, ctx: Context) -> Any:
    """summary.json, report.md and the figure of the runs finished so far; trains nothing."""
    from cplm_megatron.experiments.emergence.study import run_emergence

    return run_emergence(ctx.output, settings, ctx.data, None, ctx.jobs, ctx.command, ctx.on_done, ctx.log,
                         summarize_only=True)


def main(argv: list[str] | None = None) -> int:
    """tools/emergence.py's command line."""
    from cplm_megatron.experiments.emergence.cli import main as emergence_main

    return emergence_main(argv)


EXPERIMENT = Experiment("emergence", "does the copy head still help once the baseline copies? (tools/emergence.py)",
                        EmergenceSettings,
                        plan=lambda settings, ctx: emergence_runs(settings, corpus_dirs(settings.domains, ctx.data)),
                        run=run, report=report, main=main)
