"""Paired statistics over seeds: mean and sample std, the 95% Student t interval of per-seed paired differences,
and one arm's val loss against another's (or the cache control's) on the same seeds and validation documents."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

# Two-sided 95% Student t quantiles by degrees of freedom (seeds - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and sample standard deviation of the values that exist (`n`: how many)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return {"mean": statistics.fmean(present) if present else None,
            "std": statistics.stdev(present) if len(present) > 1 else None, "n": len(present)}


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


def paired_between(figures: dict[str, dict[int, dict[str, Any]]], a: str, b: str, key_b: str = "val_loss"
                   ) -> dict[str, Any]:
    """Per-seed val loss of arm a minus arm b's `key_b` (same seed), with the t-interval and document intervals."""
    seeds = sorted(s for s in figures[a] if s in figures[b] and figures[b][s].get(key_b) is not None)
    diffs = {s: figures[a][s]["val_loss"] - figures[b][s][key_b] for s in seeds}
    docs_b = "cache_documents" if key_b == "cache_val_loss" else "val_documents"
    return {**paired_interval(list(diffs.values())), "per_seed": {str(s): d for s, d in diffs.items()},
            "document_interval_per_seed": {str(s): document_paired(figures[a][s].get("val_documents"),
                                                                   figures[b][s].get(docs_b)) for s in seeds}}
