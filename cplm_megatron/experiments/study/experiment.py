"""The recipe study as a registered experiment (registry.py): arms x seeds x scales, the decision rule, SpamLang
with the decided default."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cplm_megatron.experiments.registry import Context, Experiment
from cplm_megatron.experiments.study.plan import StudySettings, ensure_corpora, study_runs


@dataclass
class RecipeStudySettings:
    """The study's grid and its SpamLang part (None: no SpamLang runs)."""

    grid: StudySettings = field(default_factory=StudySettings)
    spamlang: Any = None  # study.pipeline.SpamLangSettings

    @classmethod
    def smoke(cls) -> RecipeStudySettings:
        from cplm_megatron.experiments.study.pipeline import SpamLangSettings

        return cls(StudySettings.smoke(), SpamLangSettings.smoke())


def plan(settings: RecipeStudySettings, ctx: Context) -> list:
    """Every run of the grid (its corpora built under ctx.data when missing)."""
    return study_runs(settings.grid, ensure_corpora(settings.grid, ctx.data, log=ctx.log))


def run(settings: RecipeStudySettings, ctx: Context) -> Any:
    """Train and evaluate every run (finished ones reused), decide, run SpamLang, write summary.json and the report."""
    from cplm_megatron.experiments.study.pipeline import run_recipe_study

    return run_recipe_study(ctx.output, settings.grid, ctx.data, settings.spamlang, jobs=ctx.jobs,
                            threads=ctx.threads, command=ctx.command, on_done=ctx.on_done, log=ctx.log,
                            backend=ctx.backend)


def report(settings: RecipeStudySettings, ctx: Context) -> Any:
    """summary.json, report.md and the plots of the runs finished so far; trains nothing."""
    from cplm_megatron.experiments.study.pipeline import summarize_study

    return summarize_study(ctx.output, settings.grid, ctx.data, command=ctx.command, log=ctx.log)


EXPERIMENT = Experiment("study", "the recipe study: arms x seeds x scales and its decision rule (tools/ablate.py "
                        "--study)", RecipeStudySettings, plan=plan, run=run, report=report)
