"""The recipe study's decision rule (DECISION_RULE, fixed before the v3 grid ran) and its application to the
per-seed figures: which CPLM arms are credited and which one becomes the default."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cplm_megatron.experiments.paired import paired_between
from cplm_megatron.experiments.study.plan import ARMS

DECISION_RULE = (
    "Fixed before the v3 grid ran. An arm is credited only if its validation loss (the full distribution, every "
    "validation sample) is below the baseline's and below the baseline + continuous-cache control's in every seed at "
    "every scale it ran (paired: the same seed shares initialization and data order). Only arms run at every scale "
    "of the grid can become the default. Among those credited, the simplest (the earliest in the study's arm order) "
    "is kept unless a more complex credited arm beats it at every scale with a 95% t-interval over seeds of the "
    "per-seed paired difference below 0; that arm is then kept, and a later one must beat it in the same way. No arm "
    "credited: the copy head is not credited and the default is the baseline. Every decision is provisional until "
    "every run of the planned grid is in the summary."
)
PREVIOUS_DEFAULT = "aux1"  # configs/tiny.yaml's copy-head objective when this rule was fixed


@dataclass
class Decision:
    """What the rule decided: the default arm ('baseline': no copy head credited), and why."""

    default: str
    credited: list[str]  # arms that beat the baseline and the cache control in every seed at every scale they ran
    not_credited: dict[str, str]  # arm -> why not
    steps: list[str]  # the comparisons that moved (or kept) the default, in order
    reason: str


def _credit(arm: str, figures: dict[str, dict[str, dict[int, dict[str, Any]]]],
            grid_scales: Sequence[str]) -> str | None:
    """None when `arm` is credited, else why not."""
    ran = [sc for sc in grid_scales if arm in figures.get(sc, {})]
    if not ran:
        return "no finished run"
    for sc in ran:
        for control, key in (("baseline", "val_loss"), ("baseline + cache", "cache_val_loss")):
            diffs = paired_between(figures[sc], arm, "baseline", key)["per_seed"]
            if not diffs:
                return f"no {control} figure to compare with at scale {sc}"
            worse = {seed: d for seed, d in diffs.items() if not d < 0}
            if worse:
                seed, d = next(iter(worse.items()))
                return f"not below the {control} in seed {seed} at scale {sc} ({d:+.3f} nats)"
    missing = [sc for sc in grid_scales if sc not in ran]
    if missing:
        return (f"below the baseline and the cache control in every seed at {', '.join(ran)}, but not run at "
                f"{', '.join(missing)}: it cannot become the default")
    return None


def decide(figures: dict[str, dict[str, dict[int, dict[str, Any]]]],
           grid_scales: Sequence[str]) -> Decision:
    """Apply DECISION_RULE (figures: per scale, per arm, per seed; grid_scales: every scale of the planned grid)."""
    arms = [a for a in ARMS if a != "baseline" and any(a in figures.get(sc, {}) for sc in grid_scales)]
    not_credited = {a: why for a in arms if (why := _credit(a, figures, grid_scales)) is not None}
    credited = [a for a in arms if a not in not_credited]
    if not credited:
        return Decision("baseline", [], not_credited, [], "no CPLM arm beats both the baseline and the baseline + "
                        "cache control in every seed at every scale: the copy head is not credited")
    kept, steps = credited[0], []
    for challenger in credited[1:]:
        intervals = {sc: paired_between(figures[sc], challenger, kept) for sc in grid_scales}
        wins = all(i["ci_high"] is not None and i["ci_high"] < 0 for i in intervals.values())
        shown = "; ".join(f"{sc}: {i['mean']:+.3f} " + (f"[{i['ci_low']:+.3f}, {i['ci_high']:+.3f}]"
                                                       if i["ci_low"] is not None else "(no interval: < 2 seeds)")
                          for sc, i in intervals.items() if i["mean"] is not None)
        steps.append(f"{challenger} - {kept}: {shown} -> {'kept ' + challenger if wins else 'kept ' + kept}")
        if wins:
            kept = challenger
    simplest = credited[0]
    reason = (f"credited: {', '.join(credited)}; the simplest, {simplest}, " +
              ("is kept: no more complex credited arm beats it with an interval below 0 at every scale"
               if kept == simplest else f"is replaced by {kept}, which beats it with an interval below 0 at every scale"))
    return Decision(kept, credited, not_credited, steps, reason)
