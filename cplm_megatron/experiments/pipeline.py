"""Any experiment in one call, by name: its runs planned, trained and evaluated (finished runs reused), reported.

    outcome = run_experiment("ablation", AblationSettings.quick(), Context(Path("runs/ablation"), Path("data/stdlib")))
    outcome.report        # runs/ablation/report.md (+ PNG plots beside it)

    study = run_experiment("study", RecipeStudySettings(), Context(Path("runs/study"), Path("data"), jobs=2))
    study.summary["decision"]  # the default the study's rule chose; study.report, study.summary_json

Each experiment is a package declaring its `Experiment` (registry.py); `run_ablation`, `run_recipe_study` and
`summarize_study` are the ablation's and the study's own calls, named here for the callers that use them directly.
"""
from __future__ import annotations

from typing import Any

from cplm_megatron.experiments.ablation.pipeline import AblationOutcome, run_ablation  # noqa: F401 - the API
from cplm_megatron.experiments.registry import Context, experiment
from cplm_megatron.experiments.study.pipeline import (  # noqa: F401 - the API
    SpamLangSettings,
    StudyOutcome,
    run_recipe_study,
    summarize_study,
)


def plan_experiment(name: str, settings: Any, ctx: Context) -> list:
    """The runs (or jobs) of experiment `name` with `settings`; nothing is trained."""
    return experiment(name).plan(settings, ctx)


def run_experiment(name: str, settings: Any, ctx: Context) -> Any:
    """Train and evaluate what has not finished of experiment `name`, then its report; its outcome."""
    return experiment(name).run(settings, ctx)


def report_experiment(name: str, settings: Any, ctx: Context) -> Any:
    """The report of what finished of experiment `name`; trains nothing."""
    return experiment(name).report(settings, ctx)
