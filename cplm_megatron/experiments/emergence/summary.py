"""Aggregate the emergence study: each run's probe curves and the step where it starts to copy; per domain the
recipe study's figures, paired differences and decision rule (study/summary.py, the domain as the scale), credited
only where every seed's baseline copies held-out text (text_copy gain at or above the threshold)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cplm_megatron.experiments.paired import mean_std
from cplm_megatron.experiments.records import RunResults
from cplm_megatron.experiments.study.decision import DECISION_RULE, decide
from cplm_megatron.experiments.study.summary import summarize

THRESHOLD_RULE = (
    "Fixed with the pilot, before the grid ran: the recipe study's decision rule is applied per domain, and a claim "
    "is credited only in a domain where every seed's baseline copies held-out text: on its last checkpoint, the "
    "text_copy task's accuracy on a repeated span of a validation document exceeds the same tokens' accuracy at "
    "their first occurrence by at least the threshold (the gain); elsewhere the domain is reported, not judged. The "
    "copy task on uniform random tokens is reported beside it (the pilot: it stays near 0 for these models).")


def probe_curve(run: RunResults) -> list[dict[str, Any]]:
    """The run's probe records (last per iteration): tokens, random-token copy accuracy, in-context score, and the
    held-out text copy accuracy, its first-occurrence control and gain where the probe measured them."""
    per_step = int(run.spec.label["tokens_per_step"])
    by_iteration = {int(r["iteration"]): r for r in run.metrics if "probe_copy_accuracy" in r}
    return [{"iteration": it, "tokens": it * per_step, "copy_accuracy": r["probe_copy_accuracy"],
             "in_context_score": r.get("probe_in_context_score"),
             "text_copy_accuracy": r.get("probe_text_copy_accuracy"),
             "text_copy_first_accuracy": r.get("probe_text_copy_first_accuracy"),
             "text_copy_gain": r.get("probe_text_copy_gain")}
            for it, r in sorted(by_iteration.items())]


def emergence_point(curve: Sequence[dict[str, Any]], key: str, level: float) -> dict[str, Any] | None:
    """The first probe at which `key` reaches `level` (None: never); `first_measured`: no earlier probe measured
    `key` (a run whose probes gained it late), so it was reached by then, not there."""
    measured = [p for p in curve if p.get(key) is not None]
    return next(({"iteration": p["iteration"], "tokens": p["tokens"], "first_measured": i == 0 and p is not curve[0]}
                 for i, p in enumerate(measured) if p[key] >= level), None)


def run_emergence(run: RunResults, threshold: float) -> dict[str, Any]:
    """A run's curves, where its text copy gain first reaches the threshold and its random-token copy 0.1, its final
    copy figures and speed."""
    curve = probe_curve(run)
    tasks = run.final["tasks"]
    copy, text = tasks.get("copy", {}).get("metrics", {}), tasks.get("text_copy", {}).get("metrics", {})
    return {"probe_curve": curve, "text_copy_emerges": emergence_point(curve, "text_copy_gain", threshold),
            "copy_emerges_at_0.1": emergence_point(curve, "copy_accuracy", 0.1),
            "final_copy_accuracy": copy.get("copy_accuracy"), "copy_accuracy_chance": copy.get("copy_accuracy_chance"),
            "copy_accuracy_one_token_match": copy.get("copy_accuracy_one_token_match"),
            "final_text_copy_accuracy": text.get("text_copy_accuracy"),
            "final_text_copy_first_accuracy": text.get("text_copy_first_accuracy"),
            "final_text_copy_gain": text.get("text_copy_gain"),
            "tokens_per_sec": median_tokens_per_sec(run)}


def median_tokens_per_sec(run: RunResults) -> float | None:
    """The median of the run's logged interval throughputs (every launch of it: a resumed run's record holds only its
    last launch, and a window the core was shared moves a median little)."""
    values = sorted(r["tokens_per_sec"] for r in run.metrics if r.get("tokens_per_sec"))
    return values[len(values) // 2] if values else None


def domain_verdict(scale: dict[str, Any], domain: str, threshold: float, emergence: dict[str, Any]) -> dict[str, Any]:
    """The decision rule on one domain's figures, gated by the baselines' text copy gain."""
    figures = {arm: {int(seed): fig for seed, fig in entry["per_seed"].items()} for arm, entry in scale["arms"].items()}
    gains = [emergence.get(f"{domain}-baseline-s{seed}", {}).get("final_text_copy_gain") for seed in scale["seeds"]]
    copies = bool(gains) and all(g is not None and g >= threshold for g in gains)
    decision = decide({domain: figures}, [domain])
    out = {"baseline_text_copy_gain": mean_std(gains), "baseline_copies": copies, "threshold": threshold,
           "baseline_copy_accuracy": mean_std([fig["copy_accuracy"] for fig in figures["baseline"].values()]),
           "rule_outcome": {"default": decision.default, "credited": decision.credited,
                            "not_credited": decision.not_credited, "reason": decision.reason}}
    if copies:
        why = "; ".join(f"{arm}: {reason}" for arm, reason in decision.not_credited.items())
        out["credited"], out["verdict"] = decision.credited, decision.reason + (f" ({why})" if why else "")
    else:
        shown = ", ".join(f"{g:+.3f}" if g is not None else "none" for g in gains)
        out["credited"] = []
        out["verdict"] = f"not judged: the baseline's text copy gain is below {threshold} in some seed ({shown})"
    return out


def summarize_emergence(runs: Sequence[RunResults], planned: Sequence[tuple[str, str, int]],
                        threshold: float) -> dict[str, Any]:
    """summary.json's body: the recipe study's aggregation per domain, each run's emergence and the verdicts."""
    summary = summarize(runs, planned)
    summary["threshold_rule"] = THRESHOLD_RULE
    summary["rule"] = DECISION_RULE
    summary["emergence"] = {r.spec.name: run_emergence(r, threshold) for r in runs}
    summary["domains"] = {domain: domain_verdict(scale, domain, threshold, summary["emergence"])
                          for domain, scale in summary["scales"].items()}
    return summary


def pilot_table(runs: Sequence[RunResults], threshold: float) -> list[dict[str, Any]]:
    """One row per pilot run: its shape, speed, and its copy figures at each probe and at the end."""
    rows = []
    for run in runs:
        label, found = run.spec.label, run_emergence(run, threshold)
        rows.append({"name": run.spec.name, **{k: label[k] for k in ("domain", "hidden", "layers", "global_batch",
                                                                     "repeat_span_share", "iters")}, **found})
    return rows
