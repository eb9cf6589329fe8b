"""Aggregate the recipe study: per-run figures, mean ± std over seeds, paired differences, the decision.

Per run: the final validation loss of the full distribution (the mixture for CPLM) and of the LM head
alone (the `val` task over every validation sample when the run has it, with its document-bootstrap
interval; else the trainer's last periodic validation), the cache control's val loss on the baseline
(the evaluation-only arm `baseline+cache`), copy accuracy,
passkey retrieval per context length, the gradient figures, and the training efficiency: the fraction of
the baseline's training tokens at which the run's validation loss first reaches the baseline's final
validation loss (linear interpolation between evaluations; the paper's "training becomes more efficient"),
in tokens and in training FLOPs (the Copy-Paste head's FLOPs counted: cplm_megatron.model.accounting).
Per arm and scale: mean and sample standard deviation over seeds, and differences vs the baseline of
the same seed with their 95% paired t-interval over seeds. The decision applies `DECISION_RULE`.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cplm_megatron.experiments.ablation import RunResults
from cplm_megatron.experiments.multiseed import ARMS, GLOBAL_BATCH, SEQ_LEN

DECISION_RULE = (
    "Fixed before the grid ran: rank the CPLM training arms by mean validation loss (full distribution, every "
    "validation sample) at the largest scale. The best arm becomes the default only if it beats the next arm by more "
    "than the paired interval (the 95% t-interval over seeds of their per-seed difference lies below 0); otherwise "
    "the default is the simplest arm (the earliest in the study's arm order) among those the interval does not "
    "separate from the best. The decision is provisional until every run of the planned grid (every active arm x "
    "3 seeds x 2 scales) is in the summary."
)
PREVIOUS_DEFAULT = "aux1"  # configs/tiny.yaml's copy-head objective when this rule was fixed
# Two-sided 95% Student t quantiles by degrees of freedom (seeds - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
# Figures aggregated per arm; `lower` says which direction is better (for paired wins).
FIGURES: dict[str, bool] = {
    "val_loss": True,
    "lm_val_loss": True,
    "copy_accuracy": False,
    "copy_head_accuracy": False,
    "copy_mean_gate": False,
    "passkey_accuracy": False,
    "passkey_token_accuracy": False,
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
PAIRED = ("val_loss", "lm_val_loss", "copy_accuracy", "passkey_accuracy", "passkey_token_accuracy")


def val_curve(run: RunResults) -> list[tuple[int, float, float]]:
    """(iteration, val loss, LM-head val loss) of the trainer's periodic validation, last record per iteration."""
    by_iteration: dict[int, tuple[float, float]] = {}
    for record in run.metrics:
        if "val_loss" in record:
            by_iteration[int(record["iteration"])] = (record["val_loss"], record.get("val_lm_loss", record["val_loss"]))
    return [(it, *by_iteration[it]) for it in sorted(by_iteration)]


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
    """Training FLOPs per token of a run's model (backbone, LM head and, for CPLM, the Copy-Paste head): its
    label where the run records it (cluster runs), else from the CPU study's recipe and the run's overrides."""
    if run.spec.label.get("train_flops_per_token") is not None:
        return float(run.spec.label["train_flops_per_token"])
    from cplm_megatron.experiments.ablation import RECIPE
    from cplm_megatron.model.accounting import CopyHeadShape
    from cplm_megatron.model.accounting import train_flops_per_token as flops
    from cplm_megatron.training.run_config import load_run_config

    try:
        cfg = load_run_config(str(RECIPE), [f"copy_head.enabled={str(run.spec.copy_head).lower()}",
                                            *run.spec.overrides])
    except Exception:  # noqa: BLE001 - a run made from another recipe: tokens only
        return None
    shape = CopyHeadShape.of(cfg.copy_head)
    return flops(cfg.model, SEQ_LEN, shape)


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
        "copy_head_accuracy": _task_metric(run, "copy", "copy_head_accuracy"),
        "copy_mean_gate": _task_metric(run, "copy", "copy_mean_gate"),
        "passkey_accuracy": _task_metric(run, "passkey", "passkey_accuracy"),
        "passkey_token_accuracy": _task_metric(run, "passkey", "passkey_token_accuracy"),
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
        paired[figure] = {"per_seed": {str(s): d for s, d in diffs.items()}, **paired_interval(list(diffs.values())),
                          "better_in": sum(better), "seeds": len(diffs)}
    out["paired_vs_baseline"] = paired
    return out


def paired_interval(diffs: Sequence[float]) -> dict[str, Any]:
    """Mean, std and the 95% t-interval over seeds of per-seed paired differences (no interval below 2 seeds)."""
    stats = mean_std(diffs)
    n = stats["n"]
    if n >= 2 and stats["std"] is not None:
        half = T95.get(n - 1, 1.96) * stats["std"] / math.sqrt(n)
        stats.update(ci_low=stats["mean"] - half, ci_high=stats["mean"] + half)
    else:
        stats.update(ci_low=None, ci_high=None)
    return stats


def document_paired(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[float] | None:
    """(difference, low, high) of loss a - loss b on the same validation documents (document bootstrap)."""
    from cplm_megatron.evaluation.metrics import bootstrap_paired_ci

    if not a or not b or a["ids"] != b["ids"] or a["count"] != b["count"]:
        return None
    return list(bootstrap_paired_ci(a["nll"], b["nll"], a["count"]))


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


def paired_between(figures: dict[str, dict[int, dict[str, Any]]], a: str, b: str, key_b: str = "val_loss"
                   ) -> dict[str, Any]:
    """Per-seed val loss of arm a minus arm b's `key_b` (same seed), with the t-interval and document intervals."""
    seeds = sorted(s for s in figures[a] if s in figures[b] and figures[b][s].get(key_b) is not None)
    diffs = {s: figures[a][s]["val_loss"] - figures[b][s][key_b] for s in seeds}
    docs_b = "cache_documents" if key_b == "cache_val_loss" else "val_documents"
    return {**paired_interval(list(diffs.values())), "per_seed": {str(s): d for s, d in diffs.items()},
            "document_interval_per_seed": {str(s): document_paired(figures[a][s].get("val_documents"),
                                                                   figures[b][s].get(docs_b)) for s in seeds}}


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
    qualified: list[str]  # arms the interval does not separate from the best (the best first)
    reason: str
    established: bool = False  # the best beat the next arm by more than the paired interval
    ranking: list[str] | None = None


def decide(scales: dict[str, dict[str, Any]], largest: str, figures: dict[str, dict[int, dict[str, Any]]]
           ) -> Decision:
    """Apply DECISION_RULE at the largest scale (figures: that scale's per-arm, per-seed figures)."""
    arms = [a for a in scales[largest]["arms"] if a != "baseline" and a in ARMS]
    mean = {a: scales[largest]["arms"][a]["mean_std"]["val_loss"]["mean"] for a in arms}
    ranking = sorted(arms, key=lambda a: mean[a])
    best = ranking[0]
    if len(ranking) == 1:
        return Decision(best, [best], f"{best} is the only CPLM arm at scale {largest}", False, ranking)
    vs_next = paired_between(figures, best, ranking[1])
    if vs_next["ci_high"] is not None and vs_next["ci_high"] < 0:
        return Decision(best, [best], (
            f"{best} has the lowest mean validation loss at scale {largest} ({mean[best]:.3f}) and beats the next arm "
            f"{ranking[1]} by {vs_next['mean']:+.3f}, 95% paired interval [{vs_next['ci_low']:+.3f}, "
            f"{vs_next['ci_high']:+.3f}] over {vs_next['n']} seeds (below 0)"), True, ranking)
    tied = [best] + [a for a in ranking[1:] if not _separated(paired_between(figures, a, best))]
    simplest = min(tied, key=list(ARMS).index)
    interval = ("no interval (fewer than 2 seeds)" if vs_next["ci_low"] is None else
                f"95% paired interval [{vs_next['ci_low']:+.3f}, {vs_next['ci_high']:+.3f}]")
    return Decision(simplest, tied, (
        f"{best} has the lowest mean validation loss at scale {largest} ({mean[best]:.3f}) but does not beat the next "
        f"arm {ranking[1]} by more than the paired interval ({vs_next['mean']:+.3f}, {interval}); the simplest arm "
        f"the interval does not separate from {best} is {simplest} (among {tied})"), False, ranking)


def _separated(paired: dict[str, Any]) -> bool:
    """Whether a paired difference (arm - best) is above 0 beyond its interval."""
    return paired["ci_low"] is not None and paired["ci_low"] > 0


def summarize(runs: Sequence[RunResults], planned: Sequence[tuple[str, str, int]] | None = None) -> dict[str, Any]:
    """The study's summary.json body (without command/wall time): per scale, per arm, and the decision;
    provisional while a `planned` (scale, arm, seed) is missing (default: the CPU study's grid)."""
    by_key = {(r.spec.label["scale"], r.spec.label["arm"], r.spec.label["seed"]): r for r in runs}
    scales: dict[str, dict[str, Any]] = {}
    all_figures: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
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
        all_figures[scale] = figures
        cache = cache_arm(figures["baseline"])
        scales[scale] = {
            "cache_control": cache,
            "vs_cache": ({a: paired_between(figures, a, "baseline", "cache_val_loss") for a in arms if a != "baseline"}
                         if cache else {}),
            "baseline_copy_accuracy": mean_std([figures["baseline"][s]["copy_accuracy"] for s in seeds]),
            "model": {k: sample[k] for k in ("hidden", "layers", "vocab", "iters")},
            "tokens": sample["iters"] * int(sample.get("tokens_per_step", GLOBAL_BATCH * SEQ_LEN)),
            "seeds": seeds,
            "baseline_flattening": flattening([figures["baseline"][s]["val_curve"] for s in seeds]),
            "arms": {a: {"description": ARMS[a].description, "overrides": list(ARMS[a].overrides),
                         **aggregate_arm(figures[a], figures["baseline"])} for a in arms},
        }
    largest = max(order, key=lambda s: scales[s]["model"]["hidden"] * scales[s]["model"]["layers"])
    decision = decide(scales, largest, all_figures[largest])
    from cplm_megatron.experiments.multiseed import StudySettings

    present = set(by_key)
    planned = list(planned) if planned is not None else StudySettings().planned()
    missing = [f"{sc}-{a}-s{s}" for sc, a, s in planned if (sc, a, s) not in present]
    return {"rule": DECISION_RULE, "scales": scales, "largest_scale": largest,
            "decision": {"default": decision.default, "overrides": list(ARMS[decision.default].overrides),
                         "qualified": decision.qualified, "reason": decision.reason,
                         "established": decision.established, "ranking": decision.ranking,
                         "previous_default": PREVIOUS_DEFAULT,
                         "provisional": bool(missing), "planned_runs_missing": len(missing),
                         "planned_runs": len(planned)},
            "planned_scales": list(dict.fromkeys(sc for sc, _, _ in planned))}
