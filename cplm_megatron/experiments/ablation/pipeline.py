"""The whole ablation in one call: plan, train and evaluate every run, write the report.

    outcome = run_ablation(Path("runs/ablation"), AblationSettings.quick(), data_dir=Path("data/stdlib"))
    outcome.report        # runs/ablation/report.md (+ PNG plots beside it)
    outcome.spamlang      # per SpamLang pair: steps to >= 99% accuracy for CPLM and baseline, ...
"""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.ablation.plan import AblationSettings, ablation_runs
from cplm_megatron.experiments.ablation.report import pair_up, spamlang_claims, write_report
from cplm_megatron.experiments.launch.launcher import JobResult, Launcher
from cplm_megatron.experiments.progress import LogWatcher, RunProgress
from cplm_megatron.experiments.records import RunResults, load_run


@dataclass
class AblationOutcome:
    """Where the report is and the headline numbers."""

    report: Path
    results_json: Path
    spamlang: list[dict[str, Any]]
    runs: list[RunResults]
    seconds: float


def run_ablation(output: Path, settings: AblationSettings, data_dir: Path | None = None, tp: int = 1, jobs: int = 2,
                 threads: int = 1, command: str = "", on_done: Callable[[JobResult], None] | None = None,
                 backend: str = "warm", progress_every: float = 0.0) -> AblationOutcome:
    """Train/evaluate every pair of `settings` under `output` (finished runs are reused) and write the report;
    `progress_every` > 0: print the running jobs' progress that often (LogWatcher).

    Raises RuntimeError naming the logs of failed runs; ValueError/FileNotFoundError for bad settings/data.
    """
    output = Path(output).resolve()
    specs = ablation_runs(settings, data_dir)
    start = time.perf_counter()
    launcher = Launcher(output, Path(data_dir).resolve().parent if data_dir is not None else None, tp, threads, backend)
    progress = RunProgress(specs, jobs)

    def done(result: JobResult) -> None:
        progress.finish(result)
        result.progress = (progress.position(result.spec.name), progress.note())
        if on_done is not None:
            on_done(result)

    with LogWatcher(output / "runs", progress_every, lambda line: print(line, flush=True), progress):
        jobs_done = launcher.run_all(specs, jobs=jobs, on_done=done)
    meta = {"command": command, "settings": {**dataclasses.asdict(settings), "tp": tp},
            "seconds": time.perf_counter() - start,
            "runtimes": {r.spec.name: (r.train_seconds, r.eval_seconds) for r in jobs_done}}
    return write_ablation(output, specs, meta)


def report_ablation(output: Path, settings: AblationSettings, data_dir: Path | None = None, tp: int = 1,
                    command: str = "") -> AblationOutcome:
    """The report of an ablation whose runs all finished (nothing is trained; FileNotFoundError naming a run that
    did not)."""
    output = Path(output).resolve()
    meta = {"command": command, "settings": {**dataclasses.asdict(settings), "tp": tp}, "seconds": 0.0,
            "runtimes": {}}
    return write_ablation(output, ablation_runs(settings, data_dir), meta)


def write_ablation(output: Path, specs: list, meta: dict[str, Any]) -> AblationOutcome:
    """report.md, the plots and results.json of the finished runs `specs`."""
    runs = [load_run(spec, output) for spec in specs]
    report = write_report(output, runs, meta)
    claims = spamlang_claims(pair_up(runs))
    results_json = output / "results.json"
    results_json.write_text(json.dumps({
        "meta": meta, "spamlang": claims,
        "runs": {r.spec.name: {"label": r.spec.label, "metrics": r.metrics, "evaluations": r.checkpoints}
                 for r in runs},
    }, indent=2) + "\n")
    return AblationOutcome(report, results_json, claims, runs, meta["seconds"])
