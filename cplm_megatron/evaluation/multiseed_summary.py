"""Aggregate the recipe study: per-run figures, mean ± std over seeds, paired differences, the decision.

Per run: the final validation loss of the full distribution (the mixture for CPLM) and of the LM head
alone (the trainer's last periodic validation, the same batches for every arm of a seed), copy accuracy,
passkey retrieval per context length, the gradient figures, and the training efficiency: the fraction of
the baseline's training tokens at which the run's validation loss first reaches the baseline's final
validation loss (linear interpolation between evaluations; the paper's "training becomes more efficient").
Per arm and scale: mean and sample standard deviation over seeds, and differences vs the baseline of
the same seed. The decision applies `DECISION_RULE`, fixed before the study ran.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cplm_megatron.evaluation.ablation import RunResults
from cplm_megatron.evaluation.multiseed import ARMS, GLOBAL_BATCH, SEQ_LEN

DECISION_RULE = (
    "Fixed before the study ran: the recipe default is the CPLM arm with the lowest mean validation loss (full "
    "distribution) at the largest scale, among the arms whose validation loss is below the baseline's in every "
    "seed at every scale. If no arm qualifies, the default is the CPLM arm with the lowest mean validation loss "
    "at the largest scale, and the report says plainly that no arm beat the baseline everywhere."
)
# Figures aggregated per arm; `lower` says which direction is better (for paired wins).
FIGURES: dict[str, bool] = {
    "val_loss": True,
    "lm_val_loss": True,
    "copy_accuracy": False,
    "passkey_accuracy": False,
    "passkey_token_accuracy": False,
    "efficiency": True,
    "logit_grad_outside_span": True,
    "copy_grad_share": False,
}
PAIRED = ("val_loss", "lm_val_loss", "copy_accuracy", "passkey_accuracy", "passkey_token_accuracy")


def val_curve(run: RunResults) -> list[tuple[int, float, float]]:
    """(iteration, val loss, LM-head val loss) of the trainer's periodic validation, last record per iteration."""
    by_iteration: dict[int, tuple[float, float]] = {}
    for record in run.metrics:
        if "val_loss" in record:
            by_iteration[int(record["iteration"])] = (record["val_loss"], record.get("val_lm_loss", record["val_loss"]))
    return [(it, *by_iteration[it]) for it in sorted(by_iteration)]


def tokens_to_reach(curve: Sequence[tuple[int, float]], target: float) -> float | None:
    """Training tokens at which a (iteration, loss) curve first reaches `target` (None: never).

    Linear interpolation between evaluations; a curve already at or below the target at its first
    evaluation reports that evaluation (an upper bound)."""
    previous = None
    for iteration, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(iteration * GLOBAL_BATCH * SEQ_LEN)
            (it0, loss0) = previous
            fraction = (loss0 - target) / (loss0 - loss)
            return float((it0 + fraction * (iteration - it0)) * GLOBAL_BATCH * SEQ_LEN)
        previous = (iteration, loss)
    return None


def _task_metric(run: RunResults, task: str, metric: str) -> float | None:
    return run.final["tasks"].get(task, {}).get("metrics", {}).get(metric)


def passkey_by_length(run: RunResults) -> dict[int, dict[str, float]]:
    """Whole-key and per-token retrieval per context length, averaged over needle depths."""
    details = run.final["tasks"].get("passkey", {}).get("details")
    if not details:
        return {}
    out = {}
    for length in details["lengths"]:
        cells = [c for c in details["grid"] if c["length"] == length]
        out[length] = {"accuracy": statistics.fmean(c["accuracy"] for c in cells),
                       "token_accuracy": statistics.fmean(c["token_accuracy"] for c in cells)}
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
    base_tokens = base_curve[-1][0] * GLOBAL_BATCH * SEQ_LEN
    reached = tokens_to_reach([(it, v) for it, v, _ in curve], base_curve[-1][1])
    return {
        "val_loss": curve[-1][1],
        "lm_val_loss": curve[-1][2],
        "copy_accuracy": _task_metric(run, "copy", "copy_accuracy"),
        "passkey_accuracy": _task_metric(run, "passkey", "passkey_accuracy"),
        "passkey_token_accuracy": _task_metric(run, "passkey", "passkey_token_accuracy"),
        "passkey_by_length": passkey_by_length(run),
        "efficiency": None if reached is None else reached / base_tokens,
        "logit_grad_outside_span": _task_metric(run, "gradient", "logit_grad_outside_span"),
        "copy_grad_share": _task_metric(run, "gradient", "copy_grad_share"),
        "val_curve": [{"iteration": it, "tokens": it * GLOBAL_BATCH * SEQ_LEN, "val_loss": v, "lm_val_loss": lm}
                      for it, v, lm in curve],
    }


def mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation of the values that exist (`n`: how many)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return {"mean": statistics.fmean(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None, "n": len(present)}


def aggregate_arm(per_seed: dict[int, dict[str, Any]], baseline: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean/std per figure, passkey per length, and paired differences vs the same seed's baseline."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {"per_seed": {str(s): per_seed[s] for s in seeds},
                           "mean_std": {f: mean_std([per_seed[s][f] for s in seeds]) for f in FIGURES}}
    lengths = sorted({int(length) for s in seeds for length in per_seed[s]["passkey_by_length"]})
    out["passkey_by_length"] = {
        str(length): {key: mean_std([per_seed[s]["passkey_by_length"].get(length, {}).get(key) for s in seeds])
                      for key in ("accuracy", "token_accuracy")}
        for length in lengths}
    paired = {}
    for figure in PAIRED:
        diffs = {s: per_seed[s][figure] - baseline[s][figure] for s in seeds
                 if per_seed[s][figure] is not None and baseline[s][figure] is not None}
        better = [(d < 0) if FIGURES[figure] else (d > 0) for d in diffs.values()]
        paired[figure] = {"per_seed": {str(s): d for s, d in diffs.items()}, **mean_std(list(diffs.values())),
                          "better_in": sum(better), "seeds": len(diffs)}
    out["paired_vs_baseline"] = paired
    return out


def flattening(curves: Sequence[list[dict[str, Any]]]) -> dict[str, Any]:
    """How flat the baseline's val loss is at the end: mean over seeds at 50/75/100% of training and the
    relative improvement over the last quarter."""
    def at(curve: list[dict[str, Any]], fraction: float) -> float:
        last = curve[-1]["iteration"]
        return min(curve, key=lambda p: abs(p["iteration"] - fraction * last))["val_loss"]

    points = {f"{int(f * 100)}%": statistics.fmean(at(c, f) for c in curves) for f in (0.5, 0.75, 1.0)}
    last_quarter = statistics.fmean((at(c, 0.75) - at(c, 1.0)) / at(c, 1.0) for c in curves)
    return {"mean_val_loss_at": points, "relative_improvement_last_quarter": last_quarter}


@dataclass
class Decision:
    default: str
    qualified: list[str]  # arms better than the baseline in every seed at every scale
    reason: str


def decide(scales: dict[str, dict[str, Any]], largest: str) -> Decision:
    """Apply DECISION_RULE to the aggregated scales."""
    def better_everywhere(arm: str) -> bool:
        paired = [s["arms"][arm]["paired_vs_baseline"]["val_loss"] for s in scales.values() if arm in s["arms"]]
        return all(p["seeds"] > 0 and p["better_in"] == p["seeds"] for p in paired)

    arms = [a for a in scales[largest]["arms"] if a != "baseline"]
    qualified = [a for a in arms if better_everywhere(a)]
    pool = qualified or arms
    best = min(pool, key=lambda a: scales[largest]["arms"][a]["mean_std"]["val_loss"]["mean"])
    mean = scales[largest]["arms"][best]["mean_std"]["val_loss"]
    base = scales[largest]["arms"]["baseline"]["mean_std"]["val_loss"]
    if qualified:
        reason = (f"{best}: below the baseline's validation loss in every seed at every scale, and the lowest mean "
                  f"at scale {largest} ({mean['mean']:.3f} vs baseline {base['mean']:.3f}) among {qualified}")
    else:
        reason = (f"no CPLM arm beat the baseline in every seed at every scale; {best} has the lowest mean validation "
                  f"loss at scale {largest} ({mean['mean']:.3f} vs baseline {base['mean']:.3f})")
    return Decision(best, qualified, reason)


def summarize(runs: Sequence[RunResults]) -> dict[str, Any]:
    """The study's summary.json body (without command/wall time): per scale, per arm, and the decision."""
    by_key = {(r.spec.label["scale"], r.spec.label["arm"], r.spec.label["seed"]): r for r in runs}
    scales: dict[str, dict[str, Any]] = {}
    order = list(dict.fromkeys(r.spec.label["scale"] for r in runs))
    for scale in order:
        keys = [k for k in by_key if k[0] == scale]
        seeds = sorted({k[2] for k in keys})
        arms = [a for a in ARMS if any(k[1] == a for k in keys)]
        if "baseline" not in arms:
            raise ValueError(f"scale {scale} has no baseline runs")
        missing = [f"{scale}-{a}-s{s}" for a in arms for s in seeds if (scale, a, s) not in by_key]
        if missing:
            raise ValueError(f"the study is incomplete: runs {missing} are missing")
        figures = {a: {s: run_figures(by_key[(scale, a, s)], by_key[(scale, "baseline", s)]) for s in seeds}
                   for a in arms}
        sample = by_key[(scale, "baseline", seeds[0])].spec.label
        scales[scale] = {
            "model": {k: sample[k] for k in ("hidden", "layers", "vocab", "iters")},
            "tokens": sample["iters"] * GLOBAL_BATCH * SEQ_LEN,
            "seeds": seeds,
            "baseline_flattening": flattening([figures["baseline"][s]["val_curve"] for s in seeds]),
            "arms": {a: {"description": ARMS[a].description, "overrides": list(ARMS[a].overrides),
                         **aggregate_arm(figures[a], figures["baseline"])} for a in arms},
        }
    largest = max(order, key=lambda s: scales[s]["model"]["hidden"] * scales[s]["model"]["layers"])
    decision = decide(scales, largest)
    return {"rule": DECISION_RULE, "scales": scales, "largest_scale": largest,
            "decision": {"default": decision.default, "overrides": list(ARMS[decision.default].overrides),
                         "qualified": decision.qualified, "reason": decision.reason}}
