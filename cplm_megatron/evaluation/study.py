"""The whole ablation in one call: plan, train and evaluate every pair, write the report.

    outcome = run_ablation(Path("runs/ablation"), Settings.quick(), data_dir=Path("data/stdlib"))
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

from cplm_megatron.evaluation.ablation import (
    JobResult,
    RunResults,
    Settings,
    load_run,
    pair_up,
    plan,
    run_all,
)
from cplm_megatron.evaluation.report import spamlang_claims, write_report


@dataclass
class AblationOutcome:
    """Where the report is and the headline numbers."""

    report: Path
    results_json: Path
    spamlang: list[dict[str, Any]]
    runs: list[RunResults]
    seconds: float


def run_ablation(output: Path, settings: Settings, data_dir: Path | None = None, tp: int = 1, jobs: int = 2,
                 threads: int = 1, command: str = "", on_done: Callable[[JobResult], None] | None = None
                 ) -> AblationOutcome:
    """Train/evaluate every pair of `settings` under `output` (finished runs are reused) and write the report.

    Raises RuntimeError naming the logs of failed runs; ValueError/FileNotFoundError for bad settings/data.
    """
    output = Path(output).resolve()
    specs = plan(settings, data_dir)
    start = time.perf_counter()
    jobs_done = run_all(specs, output, tp=tp, jobs=jobs, threads=threads, on_done=on_done)
    runs = [load_run(spec, output) for spec in specs]
    seconds = time.perf_counter() - start
    meta = {"command": command, "settings": {**dataclasses.asdict(settings), "tp": tp}, "seconds": seconds,
            "runtimes": {r.spec.name: (r.train_seconds, r.eval_seconds) for r in jobs_done}}
    report = write_report(output, runs, meta)
    claims = spamlang_claims(pair_up(runs))
    results_json = output / "results.json"
    results_json.write_text(json.dumps({
        "meta": meta, "spamlang": claims,
        "runs": {r.spec.name: {"label": r.spec.label, "metrics": r.metrics, "evaluations": r.checkpoints}
                 for r in runs},
    }, indent=2) + "\n")
    return AblationOutcome(report, results_json, claims, runs, seconds)
