"""The emergence study's report: report.md (the pilot's table, per domain the arms with their intervals, where
copying emerges, the verdicts) and one figure, emergence.png (per domain: validation loss, held-out text copy
accuracy beside its first-occurrence control, random-token copy accuracy and the in-context score against training
tokens, one line per run)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cplm_megatron.experiments.study.report import ARM_COLORS
from cplm_megatron.experiments.toolkit import fmt, grid, interval, plt, pm, save, table

FIGURE = "emergence.png"


def _point(found: dict[str, Any] | None) -> str:
    if found is None:
        return "not reached"
    at = f"step {found['iteration']:,} ({found['tokens'] / 1e6:.1f}M tokens)"
    return f"by {at}, its first probe measuring it" if found.get("first_measured") else at


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f}"


def _gain_curve(curve: list[dict[str, Any]]) -> str:
    """'step/1000k: in-context score / text copy gain / random-token copy accuracy' per probe."""
    return ", ".join(f"{p['iteration'] // 1000}k: {_signed(p.get('in_context_score'))} / "
                     f"{_signed(p.get('text_copy_gain'))} / {p['copy_accuracy']:.3f}" for p in curve)


def pilot_lines(rows: list[dict[str, Any]], threshold: float) -> list[str]:
    """The pilot's table: shape, speed, final copy figures, where the text copy gain reached the threshold, the
    probes."""
    lines = ["## The pilot (baselines only: where does copying emerge?)", ""]
    body = []
    for r in rows:
        body.append([r["name"], f"{r['hidden']} x {r['layers']}", str(r["global_batch"]), f"{r['repeat_span_share']:g}",
                     fmt(r["tokens_per_sec"], 0), fmt(r["final_copy_accuracy"], 3),
                     f"{fmt(r['final_text_copy_accuracy'], 3)} / {fmt(r['final_text_copy_first_accuracy'], 3)}",
                     fmt(r["final_text_copy_gain"], 3), _point(r["text_copy_emerges"]), _gain_curve(r["probe_curve"])])
    lines += table(["run", "hidden x layers", "sequences/step", "repeat share",
                    "tokens/s (one core; median of the logged intervals)",
                    "random-token copy acc. (end)", "text copy acc. / first occurrence (end)", "text copy gain (end)",
                    f"gain >= {threshold:g} at", "probes by step: in-context score / text copy gain / random-token copy acc."],
                   body, "lllrrrrrll")
    return lines + [""]


def domain_lines(name: str, scale: dict[str, Any], verdict: dict[str, Any], emergence: dict[str, Any],
                 missing: list[str] = ()) -> list[str]:
    """One domain's table and verdict (provisional while runs of the domain are `missing`)."""
    m = scale["model"]
    lines = [f"## {name} (hidden {m['hidden']}, {m['layers']} layers, V {m['vocab']}, {scale['tokens'] / 1e6:.1f}M "
             f"training tokens per run, seeds {', '.join(map(str, scale['seeds']))})", ""]
    body = []
    cache = scale.get("cache_control")
    if cache:
        body.append(["baseline+cache (control)", pm(cache["mean_std"]["val_loss"]),
                     interval(cache["paired_vs_baseline"]["val_loss"]), "–", "–", "–", "–"])
    for arm, data in scale["arms"].items():
        runs = [emergence.get(f"{name}-{arm}-s{seed}") or {} for seed in scale["seeds"]]
        where = "; ".join(_point(r.get("text_copy_emerges")) for r in runs)
        gains = "; ".join(fmt(r.get("final_text_copy_gain"), 3) for r in runs)
        vs_base = "–" if arm == "baseline" else interval(data["paired_vs_baseline"]["val_loss"])
        vs_cache = "–" if arm == "baseline" or not scale["vs_cache"] else interval(scale["vs_cache"][arm])
        body.append([arm, pm(data["mean_std"]["val_loss"]), vs_base, vs_cache, pm(data["mean_std"]["copy_accuracy"]),
                     gains, where])
    threshold = verdict["threshold"]
    lines += table(["arm", "val loss (mean ± std over seeds)", "Δ vs baseline [95% t over seeds]",
                    "Δ vs baseline+cache [95% t]", "random-token copy acc.", "text copy gain (per seed)",
                    f"gain >= {threshold:g} at (per seed)"], body, "lrrrrll")
    lines += ["", *per_seed_lines(scale), ""]
    provisional = (f" Provisional: {len(missing)} run(s) of this domain have not finished ({', '.join(missing)})."
                   if missing else "")
    lines += [f"- Baseline text copy gain {pm(verdict['baseline_text_copy_gain'])} (threshold {threshold:g}): "
              f"**{verdict['verdict']}**.{provisional}",
              f"- The rule applied as written: {verdict['rule_outcome']['reason']}.", ""]
    return lines


def _with_ci(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def per_seed_lines(scale: dict[str, Any]) -> list[str]:
    """Per seed: each arm's val loss with its document-bootstrap 95% interval, the cache control's, copy accuracy."""
    arms = list(scale["arms"])
    header = ["seed", *(f"{a} val loss [95% over documents]" for a in arms), "baseline+cache val loss",
              *(f"{a} copy acc." for a in arms)]
    body = []
    for seed in scale["seeds"]:
        figs = [scale["arms"][a]["per_seed"].get(str(seed), {}) for a in arms]
        base = scale["arms"]["baseline"]["per_seed"].get(str(seed), {})
        body.append([str(seed), *(_with_ci(f.get("val_loss"), f.get("val_loss_ci")) for f in figs),
                     _with_ci(base.get("cache_val_loss"), base.get("cache_val_loss_ci")),
                     *(fmt(f.get("copy_accuracy"), 3) for f in figs)])
    return table(header, body, "l" + "r" * (len(header) - 1))


PANELS = (("validation loss (nats)", None), ("text copy accuracy (probe; dotted: first occurrence)",
                                               "text_copy_accuracy"),
          ("random-token copy accuracy (probe)", "copy_accuracy"), ("in-context score (nats)", "in_context_score"))


def figure(summary: dict[str, Any], runs_by_name: dict[str, dict[str, Any]], path: Path) -> Path:
    """emergence.png: a row per domain; validation loss, text copy accuracy, random-token copy accuracy and the
    in-context score against training tokens, every seed's run."""
    domains = list(summary["scales"])
    fig, axes = grid(len(PANELS) * len(domains), cols=len(PANELS))
    for row, name in enumerate(domains):
        scale = summary["scales"][name]
        panels = axes[len(PANELS) * row:len(PANELS) * (row + 1)]
        for arm, data in scale["arms"].items():
            color = ARM_COLORS.get(arm, "tab:gray")
            for i, seed in enumerate(scale["seeds"]):
                label = arm if i == 0 else None
                vc = (data["per_seed"].get(str(seed)) or {}).get("val_curve", [])
                panels[0].plot([p["tokens"] / 1e6 for p in vc], [p["val_loss"] for p in vc], color=color, alpha=0.8,
                               label=label)
                curve = runs_by_name.get(f"{name}-{arm}-s{seed}", {}).get("probe_curve", [])
                for ax, (_, key) in zip(panels[1:], PANELS[1:]):
                    points = [p for p in curve if p.get(key) is not None]
                    ax.plot([p["tokens"] / 1e6 for p in points], [p[key] for p in points], color=color, alpha=0.8,
                            label=label)
                first = [p for p in curve if p.get("text_copy_first_accuracy") is not None]
                panels[1].plot([p["tokens"] / 1e6 for p in first], [p["text_copy_first_accuracy"] for p in first],
                               color=color, alpha=0.8, linestyle=":")
        for ax, (title, _) in zip(panels, PANELS):
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.set_xlabel("training tokens (millions)")
            ax.legend(fontsize=8)
        panels[3].axhline(0.0, color="black", linewidth=0.5)
    return save(fig, path)


def write_report(output: Path, summary: dict[str, Any], pilot: list[dict[str, Any]] | None) -> Path:
    """OUTPUT/report.md and OUTPUT/emergence.png from the summary (and the pilot's rows, when it ran)."""
    output = Path(output)
    threshold = summary.get("settings", {}).get("copy_threshold", 0.1)
    lines = ["# Does the copy head help once the baseline copies? (CPU, tiny models)", "",
             f"Command: `{summary.get('command', '')}`", "", f"Rule: {summary['rule']}", "",
             f"Threshold: {summary['threshold_rule']}", ""]
    if pilot:
        lines += pilot_lines(pilot, threshold)
    missing = summary["decision"]["missing_runs"]
    for name, scale in summary["scales"].items():
        lines += domain_lines(name, scale, summary["domains"][name], summary["emergence"],
                              [run for run in missing if run.startswith(f"{name}-")])
    if summary["scales"]:
        figure(summary, summary["emergence"], output / FIGURE)
        lines += [f"![validation loss, copy accuracy and in-context score against tokens]({FIGURE})", ""]
    lines += [f"Runs missing from the planned grid: {', '.join(missing) if missing else 'none'}.", ""]
    path = output / "report.md"
    path.write_text("\n".join(lines))
    plt.close("all")
    return path
