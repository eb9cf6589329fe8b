"""The GPU study's scoring: each arm's evaluation on its last checkpoint (WORK/study_eval_<arm>.json), its figures,
the controls named as such, and CPLM - baseline paired over the same validation documents."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.gpu_study.record import Record
from cplm_megatron.experiments.gpu_study.sizes import Sizes
from cplm_megatron.experiments.gpu_study.training import arm_dir, release_memory


def eval_path(work: Path, arm: str) -> Path:
    """Where an arm's evaluation is kept: WORK/study_eval_<arm>.json."""
    return work / f"study_eval_{arm}.json"


def score(arm: str, work: Path, sizes: Sizes, corpus: Path, plan: list[tuple[list[str], int]]) -> dict[str, Any]:
    """The tasks of `plan` ((names, limit) pairs) on the arm's last checkpoint; merged into
    WORK/study_eval_<arm>.json."""
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.runner import evaluate
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron

    common = dict(batch_size=sizes.eval_batch, show_progress=False, data=str(corpus / "val"),
                  dev_data=str(corpus / "dev"), copy_length=sizes.copy_length,
                  passkey_lengths=sizes.passkey_lengths, passkey_depths=sizes.passkey_depths)
    path = eval_path(work, arm)
    tasks: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    with single_process_megatron():
        scorer = MegatronScorer.load(arm_dir(work, arm))
        for names, limit in plan:
            tasks.update(evaluate(scorer, names, EvalOptions(limit=limit, **common))["tasks"])
        del scorer
    release_memory()
    path.write_text(json.dumps(tasks, indent=2))
    return tasks


def score_val(work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """Both arms' validation loss, the baseline + cache control and the paired differences."""
    for arm in ("baseline", "cplm"):
        tasks = score(arm, work, sizes, corpus, [(["val", "cache"] if arm == "baseline" else ["val"],
                                                  sizes.val_sequences)])
        record.data["arms"].setdefault(arm, {}).update(arm_figures(tasks))
        if arm == "baseline":
            record.data["controls"].update(control_figures(tasks))
    record.data["comparisons"].update(comparisons(work))


def score_tasks(work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """The copy and passkey tasks of both arms, with their controls."""
    for arm in ("baseline", "cplm"):
        tasks = score(arm, work, sizes, corpus, [(["copy"], sizes.copy_sequences),
                                                 (["passkey"], sizes.passkey_per_cell)])
        record.data["arms"][arm].update(arm_figures(tasks))
        if arm == "baseline":
            record.data["controls"].update(control_figures(tasks))


def _metric(tasks: dict[str, Any], task: str, name: str) -> Any:
    return tasks.get(task, {}).get("metrics", {}).get(name)


def arm_figures(tasks: dict[str, Any]) -> dict[str, Any]:
    """An arm's figures from its evaluation."""
    keys = {"val": ("val_loss", "val_loss_ci_low", "val_loss_ci_high", "val_lm_loss", "val_accuracy",
                    "val_in_context_score"),
            "copy": ("copy_accuracy", "copy_head_accuracy", "copy_mean_gate", "copy_sequence_accuracy"),
            "passkey": ("passkey_first_token_accuracy", "passkey_token_accuracy", "passkey_accuracy")}
    out = {name: _metric(tasks, task, name) for task, names in keys.items() for name in names}
    out["val_tokens"] = tasks.get("val", {}).get("details", {}).get("tokens")
    out["eval_seconds"] = round(sum(t.get("seconds", 0) for t in tasks.values()), 1)
    return {k: v for k, v in out.items() if v is not None}


def control_figures(tasks: dict[str, Any]) -> dict[str, Any]:
    """The controls, named as such: the baseline + cache, and what copying or guessing gets on the synthetic tasks."""
    out: dict[str, Any] = {}
    if "cache" in tasks:
        out["baseline_plus_cache"] = {"val_loss": _metric(tasks, "cache", "cache_val_loss"),
                                      "val_loss_ci": [_metric(tasks, "cache", "cache_val_loss_ci_low"),
                                                      _metric(tasks, "cache", "cache_val_loss_ci_high")],
                                      "lambda": _metric(tasks, "cache", "cache_lambda"),
                                      "theta": _metric(tasks, "cache", "cache_theta")}
    if "copy" in tasks:
        out["copy_one_token_match_copier"] = {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_one_token_match")}
        out["copy_chance"] = {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_chance")}
    if "passkey" in tasks:
        out["passkey_chance"] = {"passkey_first_token_accuracy": _metric(tasks, "passkey",
                                                                         "passkey_first_token_chance")}
    return out


def _documents(work: Path, arm: str, task: str) -> dict[int, tuple] | None:
    path = eval_path(work, arm)
    if not path.exists():
        return None
    docs = json.loads(path.read_text()).get(task, {}).get("details", {}).get("documents")
    return None if docs is None else {i: (n, c) for i, n, c in zip(docs["ids"], docs["nll"], docs["count"])}


def comparisons(work: Path) -> dict[str, Any]:
    """CPLM - baseline and CPLM - (baseline + cache) val loss, paired over the same documents (95% bootstrap)."""
    from cplm_megatron.evaluation.metrics import bootstrap_paired_ci

    cplm = _documents(work, "cplm", "val")
    out: dict[str, Any] = {}
    for name, other in (("cplm_minus_baseline", _documents(work, "baseline", "val")),
                        ("cplm_minus_baseline_plus_cache", _documents(work, "baseline", "cache"))):
        if cplm is None or other is None:
            continue
        ids = sorted(set(cplm) & set(other))
        diff, low, high = bootstrap_paired_ci([cplm[i][0] for i in ids], [other[i][0] for i in ids],
                                              [cplm[i][1] for i in ids])
        out[name] = {"val_loss": diff, "ci": [low, high], "documents": len(ids)}
    return out
