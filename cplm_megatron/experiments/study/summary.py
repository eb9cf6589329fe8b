"""Aggregate the recipe study: per-run figures, mean ± std over seeds, paired differences, the decision.

Per run: the final validation loss of the full distribution (the mixture for CPLM) and of the LM head
alone (the `val` task over every validation sample when the run has it, with its document-bootstrap
interval; else the trainer's last periodic validation), the cache control's val loss on the baseline
(the evaluation-only arm `baseline+cache`), copy accuracy,
passkey retrieval per context length, the gradient figures, and the training efficiency: the fraction of
the baseline's training tokens at which the run's validation loss first reaches the baseline's final
validation loss (linear interpolation between evaluations; the paper's "training becomes more efficient"),
in tokens and in training FLOPs (the Copy-Paste head's FLOPs counted: cplm_megatron.model.sizing.accounting).
Per arm and scale: mean and sample standard deviation over seeds, and differences vs the baseline of
the same seed with their 95% paired t-interval over seeds (paired.py). The decision: decision.py's `decide`.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from cplm_megatron.experiments.paired import mean_std, paired_between, paired_interval
from cplm_megatron.experiments.records import RunResults
from cplm_megatron.experiments.study.decision import DECISION_RULE, PREVIOUS_DEFAULT, decide
from cplm_megatron.experiments.study.plan import ARMS, GLOBAL_BATCH, SEQ_LEN
from cplm_megatron.training.metrics_log import record_nll, record_objective

# Figures aggregated per arm; `lower` says which direction is better (for paired wins).
FIGURES: dict[str, bool] = {
    "val_loss": True,
    "lm_val_loss": True,
    "copy_accuracy": False,
    "copy_head_accuracy": False,
    "copy_mean_gate": False,
    "copy_accuracy_chance": False,
    "passkey_accuracy": False,
    "passkey_token_accuracy": False,
    "passkey_first_token_accuracy": False,
    "passkey_first_token_chance": False,
    "efficiency": True,
    "efficiency_flops": True,
    "logit_grad_outside_span": True,
    "logit_grad_outside_span_chance": True,
    "retained_over_chance": False,
    "copy_grad_share": False,
    "copy_grad_projection": False,
    "copy_lm_grad_cosine": False,
    "cache_val_loss": True,
}
PAIRED = ("val_loss", "lm_val_loss", "copy_accuracy", "passkey_accuracy", "passkey_token_accuracy",
          "passkey_first_token_accuracy")


def val_curve(run: RunResults) -> list[tuple[int, float, float]]:
    """(iteration, val loss, LM-head val loss) of the trainer's periodic validation, last record per iteration."""
    by_iteration: dict[int, tuple[float, float]] = {}
    for record in run.metrics:
        if "val_loss" in record:
            by_iteration[int(record["iteration"])] = (record["val_loss"], record.get("val_lm_loss", record["val_loss"]))
    return [(it, *by_iteration[it]) for it in sorted(by_iteration)]


def train_curve(run: RunResults, per_step: int) -> list[dict[str, float]]:
    """The trainer's logged training losses: `nll` of the output distribution (the mixture for CPLM: comparable
    across arms), `lm_loss` (the LM head's own CE, CPLM's auxiliary term) and `objective` (what was minimized)."""
    return [{"iteration": r["iteration"], "tokens": r["iteration"] * per_step, "objective": record_objective(r),
             "nll": record_nll(r), "lm_loss": r.get("lm_loss", r["loss"])}
            for r in run.metrics if "loss" in r]


def tokens_per_step(run: RunResults) -> int:
    """Training tokens per optimizer step of a run (the CPU study's fixed batch unless its labels say)."""
    return int(run.spec.label.get("tokens_per_step", GLOBAL_BATCH * SEQ_LEN))


def tokens_to_reach(curve: Sequence[tuple[int, float]], target: float, per_step: int = GLOBAL_BATCH * SEQ_LEN
                    ) -> float | None:
    """Training tokens at which a (iteration, loss) curve first reaches `target` (None: never).

    Linear interpolation between evaluations; a curve already at or below the target at its first
    evaluation reports that evaluation (an upper bound)."""
    previous = None
    for iteration, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(iteration * per_step)
            (it0, loss0) = previous
            fraction = (loss0 - target) / (loss0 - loss)
            return float((it0 + fraction * (iteration - it0)) * per_step)
        previous = (iteration, loss)
    return None


def _task_metric(run: RunResults, task: str, metric: str) -> float | None:
    return run.final["tasks"].get(task, {}).get("metrics", {}).get(metric)


def train_flops_per_token(run: RunResults) -> float | None:
    """Training FLOPs per token of a run's model (backbone, LM head and, for CPLM, the Copy-Paste head; no
    recompute), as its trainer recorded it; None for a run without a record. Records written before
    model_flops_per_token hold only the hardware's figure, the model's when the run recomputed nothing (the
    study's runs)."""
    if run.record is None:
        return None
    model = run.record.model_flops_per_token
    return float(model if model is not None else run.record.flops_per_token)


def passkey_by_length(run: RunResults) -> dict[int, dict[str, float]]:
    """Whole-key and per-token retrieval per context length, averaged over needle depths."""
    details = run.final["tasks"].get("passkey", {}).get("details")
    if not details:
        return {}
    out = {}
    for length in details["lengths"]:
        cells = [c for c in details["grid"] if c["length"] == length]
        out[length] = {"accuracy": statistics.fmean(c["accuracy"] for c in cells),
                       "token_accuracy": statistics.fmean(c["token_accuracy"] for c in cells),
                       "first_token_accuracy": (statistics.fmean(c["first_token_accuracy"] for c in cells)
                                                if all("first_token_accuracy" in c for c in cells) else None)}
    return out


def run_figures(run: RunResults, baseline: RunResults) -> dict[str, Any]:
    """The per-run figures of the study (efficiency relative to `baseline`, the same seed and scale)."""
    curve = val_curve(run)
    base_curve = val_curve(baseline)
    if not curve or not base_curve:
        raise ValueError(f"run {run.spec.name} (or its baseline) logged no validation: train.eval_interval was 0")
    label = run.spec.label
    if curve[-1][0] != label["iters"]:
        raise ValueError(f"run {run.spec.name}: the last validation is at iteration {curve[-1][0]}, not at the "
                         f"end ({label['iters']}); the run did not finish")
    per_step = tokens_per_step(run)
    base_tokens = base_curve[-1][0] * per_step
    reached = tokens_to_reach([(it, v) for it, v, _ in curve], base_curve[-1][1], per_step)
    flops, base_flops = train_flops_per_token(run), train_flops_per_token(baseline)
    val = run.final["tasks"].get("val", {})
    full = val.get("metrics")  # every validation sample, with the document interval
    return {
        "val_loss": full["val_loss"] if full else curve[-1][1],
        "lm_val_loss": full.get("val_lm_loss", full["val_loss"]) if full else curve[-1][2],
        "val_loss_source": "val task (every sample)" if full else "trainer's periodic validation",
        "val_loss_ci": [full["val_loss_ci_low"], full["val_loss_ci_high"]] if full else None,
        "val_documents": val.get("details", {}).get("documents"),
        "cache_val_loss": _task_metric(run, "cache", "cache_val_loss"),
        "cache_val_loss_ci": ([_task_metric(run, "cache", "cache_val_loss_ci_low"),
                               _task_metric(run, "cache", "cache_val_loss_ci_high")]
                              if _task_metric(run, "cache", "cache_val_loss") is not None else None),
        "cache_lambda": _task_metric(run, "cache", "cache_lambda"),
        "cache_theta": _task_metric(run, "cache", "cache_theta"),
        "cache_documents": run.final["tasks"].get("cache", {}).get("details", {}).get("documents"),
        "copy_accuracy": _task_metric(run, "copy", "copy_accuracy"),
        "copy_accuracy_chance": _task_metric(run, "copy", "copy_accuracy_chance"),
        "copy_head_accuracy": _task_metric(run, "copy", "copy_head_accuracy"),
        "copy_mean_gate": _task_metric(run, "copy", "copy_mean_gate"),
        "passkey_accuracy": _task_metric(run, "passkey", "passkey_accuracy"),
        "passkey_token_accuracy": _task_metric(run, "passkey", "passkey_token_accuracy"),
        "passkey_first_token_accuracy": _task_metric(run, "passkey", "passkey_first_token_accuracy"),
        "passkey_first_token_chance": _task_metric(run, "passkey", "passkey_first_token_chance"),
        "passkey_by_length": passkey_by_length(run),
        "efficiency": None if reached is None else reached / base_tokens,
        "train_flops_per_token": flops,
        "efficiency_flops": (None if reached is None or flops is None or base_flops is None
                             else reached * flops / (base_tokens * base_flops)),
        "logit_grad_outside_span": _task_metric(run, "gradient", "logit_grad_outside_span"),
        "logit_grad_outside_span_chance": _task_metric(run, "gradient", "logit_grad_outside_span_chance"),
        "retained_over_chance": _task_metric(run, "gradient", "retained_over_chance"),
        "copy_grad_share": _task_metric(run, "gradient", "copy_grad_share"),
        "copy_grad_projection": _task_metric(run, "gradient", "copy_grad_projection"),
        "copy_lm_grad_cosine": _task_metric(run, "gradient", "copy_lm_grad_cosine"),
        "val_curve": [{"iteration": it, "tokens": it * per_step, "val_loss": v, "lm_val_loss": lm}
                      for it, v, lm in curve],
        "train_curve": train_curve(run, per_step),
    }


def aggregate_arm(per_seed: dict[int, dict[str, Any]], baseline: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean/std per figure, passkey per length, and paired differences vs the same seed's baseline."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {"per_seed": {str(s): per_seed[s] for s in seeds},
                           "mean_std": {f: mean_std([per_seed[s][f] for s in seeds]) for f in FIGURES}}
    lengths = sorted({int(length) for s in seeds for length in per_seed[s]["passkey_by_length"]})
    out["passkey_by_length"] = {
        str(length): {key: mean_std([per_seed[s]["passkey_by_length"].get(length, {}).get(key) for s in seeds])
                      for key in ("accuracy", "token_accuracy", "first_token_accuracy")}
        for length in lengths}
    paired = {}
    for figure in PAIRED:
        diffs = {s: per_seed[s][figure] - baseline[s][figure] for s in seeds
                 if per_seed[s][figure] is not None and baseline[s][figure] is not None}
        better = [(d < 0) if FIGURES[figure] else (d > 0) for d in diffs.values()]
        paired[figure] = {"per_seed": {str(s): d for s, d in diffs.items()}, **paired_interval(list(diffs.values())),
                          "better_in": sum(better), "seeds": len(diffs)}
    out["paired_vs_baseline"] = paired
    return out


def cache_arm(baseline: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluation-only arm `baseline+cache`: the baseline's checkpoints with the tuned continuous cache."""
    seeds = sorted(s for s in baseline if baseline[s].get("cache_val_loss") is not None)
    if not seeds:
        return None
    per_seed = {str(s): {k: baseline[s][k] for k in ("cache_val_loss", "cache_val_loss_ci", "cache_lambda",
                                                     "cache_theta")} for s in seeds}
    diffs = [baseline[s]["cache_val_loss"] - baseline[s]["val_loss"] for s in seeds]
    return {"description": "evaluation only: the baseline + a continuous cache (Grave et al. 2017), lambda/theta "
                           "tuned on the dev split", "per_seed": per_seed,
            "mean_std": {"val_loss": mean_std([baseline[s]["cache_val_loss"] for s in seeds])},
            "paired_vs_baseline": {"val_loss": {**paired_interval(diffs), "per_seed": dict(zip(map(str, seeds), diffs)),
                                                "better_in": sum(d < 0 for d in diffs), "seeds": len(diffs)}}}


def copy_controls(run: RunResults) -> dict[str, Any] | None:
    """What copying without a trained model gets on the copy task the runs were scored on: chance and the
    one-token-match copier (recomputed from the task's samples where the evaluation predates that metric)."""
    copy = run.final["tasks"].get("copy")
    if copy is None:
        return None
    metrics, details = copy["metrics"], copy.get("details")
    if "copy_accuracy_one_token_match" in metrics:
        return {k: metrics[k] for k in ("copy_accuracy_chance", "copy_accuracy_one_token_match")}
    if not details or "sequences" not in details:
        return None
    from cplm_megatron.evaluation.copiers import copy_task_controls
    from cplm_megatron.evaluation.options import EVAL_SEED

    vocab = round(1 / metrics["copy_accuracy_chance"]) + 1
    return copy_task_controls(details.get("layout", "half"), details["sequences"], details["length"], vocab, EVAL_SEED)


def flattening(curves: Sequence[list[dict[str, Any]]]) -> dict[str, Any]:
    """How flat the baseline's val loss is at the end: mean over seeds at 50/75/100% of training and the
    relative improvement over the last quarter."""
    def at(curve: list[dict[str, Any]], fraction: float) -> float:
        last = curve[-1]["iteration"]
        return min(curve, key=lambda p: abs(p["iteration"] - fraction * last))["val_loss"]

    points = {f"{int(f * 100)}%": statistics.fmean(at(c, f) for c in curves) for f in (0.5, 0.75, 1.0)}
    last_quarter = statistics.fmean((at(c, 0.75) - at(c, 1.0)) / at(c, 1.0) for c in curves)
    return {"mean_val_loss_at": points, "relative_improvement_last_quarter": last_quarter}


def _complete_seeds(by_key: dict[tuple[str, str, int], RunResults], scale: str) -> list[int]:
    """Seeds of `scale` that have a baseline run (a CPLM run is compared with the baseline of its seed)."""
    return sorted({k[2] for k in by_key if k[0] == scale and k[1] == "baseline"})


def second_scale_check(scales: dict[str, dict[str, Any]], first: str) -> dict[str, Any]:
    """Whether the arms of the later scales are the two best of the first scale (by mean paired difference against
    the cache control, else against the baseline)."""
    vs = scales[first]["vs_cache"] or {a: v["paired_vs_baseline"]["val_loss"]
                                       for a, v in scales[first]["arms"].items() if a != "baseline"}
    ranked = sorted((a for a in vs if vs[a]["mean"] is not None), key=lambda a: vs[a]["mean"])
    return {"first_scale": first, "two_best": ranked[:2],
            "later_scales": {sc: [a for a in v["arms"] if a != "baseline"] for sc, v in scales.items() if sc != first},
            "match": all(set(ranked[:2]) == {a for a in v["arms"] if a != "baseline"}
                         for sc, v in scales.items() if sc != first)}


def summarize(runs: Sequence[RunResults], planned: Sequence[tuple[str, str, int]] | None = None) -> dict[str, Any]:
    """The study's summary.json body (without command/wall time): per scale, per arm, comparisons, the decision.
    Works on a partial grid (a run without its seed's baseline is listed, not compared); provisional while a
    `planned` (scale, arm, seed) is missing (default: the CPU study's grid)."""
    from cplm_megatron.experiments.study.plan import StudySettings

    planned = list(planned) if planned is not None else StudySettings().planned()
    by_key = {(r.spec.label["scale"], r.spec.label["arm"], r.spec.label["seed"]): r for r in runs}
    order = list(dict.fromkeys([sc for sc, _, _ in planned] + [r.spec.label["scale"] for r in runs]))
    scales: dict[str, dict[str, Any]] = {}
    all_figures: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    unpaired: list[str] = []
    for scale in order:
        seeds = _complete_seeds(by_key, scale)
        unpaired += [f"{sc}-{a}-s{s}" for sc, a, s in by_key if sc == scale and s not in seeds]
        if not seeds:
            continue
        arms = [a for a in ARMS if any((scale, a, s) in by_key for s in seeds)]
        figures = {a: {s: run_figures(by_key[(scale, a, s)], by_key[(scale, "baseline", s)]) for s in seeds
                       if (scale, a, s) in by_key} for a in arms}
        sample = by_key[(scale, "baseline", seeds[0])].spec.label
        all_figures[scale] = figures
        cache = cache_arm(figures["baseline"])
        cplm = [a for a in arms if a != "baseline"]
        scales[scale] = {
            "cache_control": cache,
            "vs_baseline": {a: paired_between(figures, a, "baseline") for a in cplm},
            "vs_cache": ({a: paired_between(figures, a, "baseline", "cache_val_loss") for a in cplm} if cache else {}),
            "between_arms": {f"{b} - {a}": paired_between(figures, b, a)
                             for i, a in enumerate(cplm) for b in cplm[i + 1:]},
            "baseline_copy_accuracy": mean_std([figures["baseline"][s]["copy_accuracy"] for s in seeds]),
            "copy_controls": copy_controls(by_key[(scale, "baseline", seeds[0])]),
            "model": {k: sample[k] for k in ("hidden", "layers", "vocab", "iters")},
            "tokens": sample["iters"] * int(sample.get("tokens_per_step", GLOBAL_BATCH * SEQ_LEN)),
            "seeds": seeds,
            "baseline_flattening": flattening([figures["baseline"][s]["val_curve"] for s in seeds]),
            "arms": {a: {"description": ARMS[a].description, "overrides": list(ARMS[a].overrides),
                         **aggregate_arm(figures[a], figures["baseline"])} for a in arms},
        }
    if not scales:
        raise ValueError("no scale has a finished baseline run yet: nothing to compare")
    grid_scales = list(dict.fromkeys(sc for sc, _, _ in planned))
    judged = [sc for sc in grid_scales if sc in scales] or list(scales)  # scales with a finished baseline
    decision = decide(all_figures, judged)
    not_started = [sc for sc in grid_scales if sc not in scales]
    present = set(by_key)
    missing = [f"{sc}-{a}-s{s}" for sc, a, s in planned if (sc, a, s) not in present]
    default_overrides = list(ARMS[decision.default].overrides)
    return {"rule": DECISION_RULE, "scales": scales, "largest_scale": max(
                scales, key=lambda s: scales[s]["model"]["hidden"] * scales[s]["model"]["layers"]),
            "second_scale_check": second_scale_check(scales, next(iter(scales))) if len(scales) > 1 else None,
            "decision": {"default": decision.default, "overrides": default_overrides,
                         "credited": decision.credited, "not_credited": decision.not_credited,
                         "steps": decision.steps, "reason": decision.reason,
                         "previous_default": PREVIOUS_DEFAULT,
                         "provisional": bool(missing), "planned_runs_missing": len(missing),
                         "missing_runs": missing, "unpaired_runs": unpaired, "judged_at_scales": judged,
                         "scales_not_started": not_started,
                         "planned_runs": len(planned)},
            "planned_scales": grid_scales}
