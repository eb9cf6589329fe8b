"""Run a list of tasks on one scorer; results as a JSON-ready dict and a readable table."""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks import TASKS


def parse_tasks(spec: str) -> list[str]:
    """'val,copy' -> ['val', 'copy']; 'all' -> every task but lm-eval, cache and text_copy (which need more than a
    checkpoint: the harness, a dev split, documents of copy_length / 2 tokens); unknown names are an error."""
    names = [t.strip() for t in spec.split(",") if t.strip()]
    if names == ["all"]:
        return [t for t in TASKS if t not in ("lm-eval", "cache", "text_copy")]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ValueError(f"unknown task(s) {unknown or spec!r}; choose from {', '.join(TASKS)} (or 'all')")
    return names


def evaluate(scorer: Scorer, tasks: Sequence[str], options: EvalOptions) -> dict[str, Any]:
    """{'model', 'backend', 'iteration', 'tasks': {name: {'metrics', 'details', 'seconds'}}}."""
    options.validate()
    out: dict[str, Any] = {"model": scorer.description, "backend": scorer.backend,
                           "iteration": getattr(scorer, "iteration", None), "copy_head": scorer.has_copy_head,
                           "tasks": {}}
    for name in tasks:
        start = time.perf_counter()
        result = TASKS[name](scorer, options)
        out["tasks"][name] = {**result.to_dict(), "seconds": round(time.perf_counter() - start, 3)}
    return out


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"


def format_table(results: dict[str, Any]) -> str:
    """Task | metric | value lines (plus how much of the validation set was scored and the passkey operating points)
    for the terminal."""
    rows = [("task", "metric", "value")]
    for task, entry in results["tasks"].items():
        for metric, value in entry["metrics"].items():
            rows.append((task, metric, _fmt(value)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{results['model']}"]
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for task in ("val", "cache"):
        scored = results["tasks"].get(task, {}).get("details", {}).get("scored")
        if scored:
            lines.append(f"{task}: scored {scored}")
    grid = results["tasks"].get("passkey", {}).get("details", {}).get("grid")
    if grid:
        lines += ["", passkey_grid_table(results["tasks"]["passkey"]["details"])]
    return "\n".join(lines)


def passkey_grid_table(details: dict[str, Any]) -> str:
    """Retrieval accuracy, context length (rows) x needle depth (columns)."""
    depths = details["depths"]
    by_cell = {(c["length"], c["depth"]): c["accuracy"] for c in details["grid"]}
    header = "passkey accuracy | " + " ".join(f"d={d:<5g}" for d in depths)
    lines = [header, "-" * len(header)]
    for length in details["lengths"]:
        lines.append(f"{'len ' + str(length):<16} | " + " ".join(f"{by_cell[(length, d)]:<7.2f}" for d in depths))
    return "\n".join(lines)


def evaluate_checkpoints(run_dir: str | Path, tasks: Sequence[str], options: EvalOptions,
                         include_initial: bool = False) -> dict[str, Any]:
    """Every checkpoint of a Megatron run, oldest first: {'run', 'checkpoints': [evaluate() results]}.

    include_initial: start with the untrained model (iteration 0, rebuilt from the run's seed)."""
    from tqdm import tqdm

    from cplm_megatron.checkpoint.lookup import all_checkpoints, is_committed
    from cplm_megatron.evaluation.scorers import MegatronScorer, cp_note, single_process_megatron

    refs = all_checkpoints(run_dir)
    models = ([("initial", refs[0].path)] if include_initial else []) + [("trained", ref.path) for ref in refs]
    curve = []
    with single_process_megatron():
        for kind, path in tqdm(models, desc=f"checkpoints of {Path(run_dir).name}", unit="ckpt",
                               disable=not options.show_progress):
            try:
                scorer = MegatronScorer.initial(path) if kind == "initial" else MegatronScorer.load(path)
            except Exception:
                if is_committed(path) or kind == "initial":
                    raise
                # a run still training pruned it after the listing: the curve goes on without it
                print(f"[evaluate] {path.name} was removed while being read (pruned by the run still training): "
                      f"skipped", file=sys.stderr, flush=True)
                continue
            note = cp_note(scorer)
            if note:
                print(note, file=sys.stderr, flush=True)
            curve.append(evaluate(scorer, tasks, options))
    return {"run": str(run_dir), "checkpoints": curve}
