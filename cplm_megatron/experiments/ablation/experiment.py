"""The ablation as a registered experiment (registry.py): baseline vs CPLM pairs on the embedded corpus and SpamLang."""
from __future__ import annotations

from typing import Any

from cplm_megatron.experiments.ablation.plan import AblationSettings, ablation_runs
from cplm_megatron.experiments.registry import Context, Experiment


def run(settings: AblationSettings, ctx: Context) -> Any:
    """Train and evaluate every pair (finished runs reused), write report.md, the plots and results.json."""
    from cplm_megatron.experiments.ablation.pipeline import run_ablation

    return run_ablation(ctx.output, settings, ctx.data, tp=ctx.processes, jobs=ctx.jobs, threads=ctx.threads,
                        command=ctx.command, on_done=ctx.on_done, backend=ctx.backend,
                        progress_every=ctx.progress_every)


def report(settings: AblationSettings, ctx: Context) -> Any:
    """The report of the finished pairs; trains nothing."""
    from cplm_megatron.experiments.ablation.pipeline import report_ablation

    return report_ablation(ctx.output, settings, ctx.data, tp=ctx.processes, command=ctx.command)


EXPERIMENT = Experiment("ablation", "baseline vs CPLM pairs on the embedded corpus and SpamLang (tools/ablate.py)",
                        AblationSettings, plan=lambda settings, ctx: ablation_runs(settings, ctx.data), run=run,
                        report=report)
