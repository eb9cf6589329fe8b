"""An evaluation's results file (eval.json, written by `python -m cplm_megatron.evaluate`): one model's task
results, or every checkpoint's (`--all-checkpoints`), with a version. One reader: `read_eval_results`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.errors import UserError, check_version

EVAL_RESULTS_VERSION = 1  # files without a version (written before it was recorded) are version 1


class EvalResultsError(UserError):
    """An eval.json that cannot be read; names the file and the fix."""


@dataclass(frozen=True)
class EvalResults:
    """Per evaluated checkpoint (by iteration, 0 = the untrained model): {"iteration", "tasks": {task: {"metrics",
    "details"}}, ...}."""

    checkpoints: list[dict[str, Any]]
    version: int = EVAL_RESULTS_VERSION

    @property
    def final(self) -> dict[str, Any]:
        """The last checkpoint's results."""
        return self.checkpoints[-1]


def with_version(results: dict[str, Any]) -> dict[str, Any]:
    """What the evaluator writes: its results with the format's version first."""
    return {"version": EVAL_RESULTS_VERSION, **results}


def read_eval_results(path: Path) -> EvalResults:
    """An eval.json; EvalResultsError naming the file when it is unreadable, of another version or has no results."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EvalResultsError(f"{path} is not a readable evaluation ({e}); evaluate the run again") from None
    if not isinstance(data, dict):
        raise EvalResultsError(f"{path} is not an evaluation (a JSON object); evaluate the run again")
    version = check_version(path, data, "an evaluation", EVAL_RESULTS_VERSION, EvalResultsError,
                            "read it with the cplm_megatron that wrote it")
    checkpoints = data.get("checkpoints", [data])  # every checkpoint, or one model's results
    if not checkpoints or not all(isinstance(c, dict) and "iteration" in c and "tasks" in c for c in checkpoints):
        raise EvalResultsError(f"{path} holds no per-checkpoint results (iteration and tasks); evaluate the run again")
    return EvalResults(sorted(checkpoints, key=lambda c: c["iteration"]), version)
