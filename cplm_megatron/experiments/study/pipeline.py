"""The recipe study in one call: plan, train and evaluate every run, decide, run SpamLang with the decided default,
write the summary and the report.

    study = run_recipe_study(Path("runs/study"), StudySettings(), Path("data"), SpamLangSettings())
    study.summary["decision"]  # the default the study's rule chose; study.report, study.summary_json
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.launch.launcher import JobResult, Launcher
from cplm_megatron.experiments.records import load_run, run_seconds, write_study_summary_json
from cplm_megatron.experiments.registry import Context, experiment
from cplm_megatron.experiments.run import Run
from cplm_megatron.experiments.study.plan import ARMS, StudySettings, ensure_corpora, study_runs
from cplm_megatron.experiments.study.report import write_study_report
from cplm_megatron.experiments.study.summary import summarize


@dataclass
class SpamLangSettings:
    """The recipe study's SpamLang part: baseline vs the chosen default at a large vocabulary, per seed (the
    baseline trains 600 steps: 10x the 60 in which the CPLM is at its ceiling from the start)."""

    vocab: int = 131072  # >= 100k: Godey & Artzi's regime
    hiddens: tuple[int, ...] = (64, 128)
    iters: int = 600
    interval: int = 100
    eval_sequences: int = 32
    seeds: tuple[int, ...] = (1, 2)

    @classmethod
    def smoke(cls) -> SpamLangSettings:
        return cls(vocab=4096, hiddens=(64,), iters=4, interval=2, eval_sequences=4, seeds=(1,))


@dataclass
class StudyOutcome:
    """Where the study's outputs are and what it decided."""

    report: Path
    summary_json: Path
    summary: dict[str, Any]


def run_recipe_study(output: Path, settings: StudySettings, data_root: Path, spamlang: SpamLangSettings | None,
                     jobs: int = 2, threads: int = 1, command: str = "",
                     on_done: Callable[[JobResult], None] | None = None, log: Callable[[str], None] = print,
                     backend: str = "warm") -> StudyOutcome:
    """Train/evaluate every run of the study (finished runs are reused), decide, run SpamLang with the decided
    default, and write OUTPUT/summary.json, OUTPUT/report.md and the plots."""
    output = Path(output).resolve()
    start = time.perf_counter()
    corpora = ensure_corpora(settings, data_root, log=log)
    specs = study_runs(settings, corpora)
    log(f"[study] {len(specs)} runs: arms {', '.join(settings.arms)} x seeds {list(settings.seeds)} x scales "
        f"{', '.join(settings.scales)} (per scale: " + "; ".join(
            f"{sc}: {len(settings.arms_at(sc))} arms x {len(settings.seeds_at(sc))} seeds" for sc in settings.scales)
        + f"); {jobs} at a time")
    Launcher(output, data_root, 1, threads, backend).run_all(specs, jobs=jobs, on_done=on_done)
    return write_study_summary(output, settings, data_root, specs, spamlang, jobs, threads, command, on_done, log,
                               start)


def spamlang_arm(summary: dict[str, Any]) -> str:
    """The CPLM arm SpamLang runs: the decided default, or (no arm credited) the lowest mean val loss at the
    largest scale."""
    if summary["decision"]["default"] != "baseline":
        return summary["decision"]["default"]
    arms = summary["scales"][summary["largest_scale"]]["arms"]
    return min((a for a in arms if a != "baseline"), key=lambda a: arms[a]["mean_std"]["val_loss"]["mean"])


def summarize_study(output: Path, settings: StudySettings, data_root: Path, command: str = "",
                    log: Callable[[str], None] = print) -> StudyOutcome:
    """summary.json, report.md and the plots of the runs of the study that finished so far (nothing is trained;
    a partial grid gives a provisional decision)."""
    output = Path(output).resolve()
    specs = study_runs(settings, ensure_corpora(settings, data_root, log=log))
    return write_study_summary(output, settings, data_root, specs, None, 1, 1, command, None, log,
                               time.perf_counter())


def spamlang_dir(output: Path, hidden: int, seed: int) -> Path:
    """Where the SpamLang pair of one hidden size and seed lives."""
    return output / f"spamlang_h{hidden}_s{seed}"


def recorded_spamlang_claims(output: Path) -> list[dict[str, Any]]:
    """The SpamLang claims an earlier invocation wrote (OUTPUT/spamlang_h<hidden>_s<seed>/results.json, by hidden
    size and seed), so a summary that runs no SpamLang keeps them."""
    def key(path: Path) -> tuple[int, int]:
        hidden, seed = path.parent.name.removeprefix("spamlang_h").split("_s")
        return int(hidden), int(seed)

    paths = sorted(output.glob("spamlang_h*_s*/results.json"), key=key)
    return [claim for path in paths for claim in json.loads(path.read_text())["spamlang"]]


def write_study_summary(output: Path, settings: StudySettings, data_root: Path, specs: list[Run],
                        spamlang: SpamLangSettings | None, jobs: int, threads: int, command: str,
                        on_done: Callable[[JobResult], None] | None, log: Callable[[str], None], start: float
                        ) -> StudyOutcome:
    """Summarize the finished runs of `specs`, run SpamLang with the decided default when asked, write the outputs."""
    launcher = Launcher(output, data_root)
    finished = [spec for spec in specs if launcher.is_finished(spec)]
    log(f"[study] {len(finished)} of {len(specs)} runs finished")
    summary = summarize([load_run(spec, output) for spec in finished], planned=StudySettings().planned())
    claims = [] if spamlang is not None else recorded_spamlang_claims(output)
    if spamlang is not None:  # SpamLang pairs are the ablation's, run by name (no experiment imports another)
        arm, ablation = ARMS[spamlang_arm(summary)], experiment("ablation")
        for hidden, seed in ((h, s) for h in spamlang.hiddens for s in spamlang.seeds):
            spam = ablation.settings(hidden_size=hidden, experiments=("spamlang",), spamlang_vocabs=(spamlang.vocab,),
                                     spamlang_ties=(False,), spamlang_iters=spamlang.iters,
                                     spamlang_interval=spamlang.interval, eval_sequences=spamlang.eval_sequences,
                                     seed=seed, extra_settings=arm.settings)
            log(f"[study] SpamLang V={spamlang.vocab}, hidden {hidden}, seed {seed}: baseline vs {arm.name}")
            claims += ablation.run(spam, Context(spamlang_dir(output, hidden, seed), jobs=jobs, threads=threads,
                                                 command=command, on_done=on_done)).spamlang
    recorded = [run_seconds(output / "runs" / spec.name) for spec in finished]
    summary.update(command=command, seconds_this_invocation=time.perf_counter() - start,
                   run_seconds_total=sum(t for t in recorded if t is not None),
                   runs_with_timing=sum(t is not None for t in recorded), jobs=jobs,
                   settings=dataclasses.asdict(settings), spamlang=claims)
    summary_json = write_study_summary_json(output / "summary.json", summary)
    report = write_study_report(output, summary, claims)
    return StudyOutcome(report, summary_json, summary)
