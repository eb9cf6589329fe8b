"""The recipe study's report: report.md, PNG plots with error bands, and the README's headline table.

Input: the body of summary.json (`cplm_megatron.experiments.multiseed_summary.summarize`) plus the command
and wall time. Plots: val_loss_curves.png (full distribution and LM head, mean ± std over seeds vs tokens),
final_metrics.png (bars with ± std), passkey_by_length.png.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cplm_megatron.experiments.multiseed import SCALES

README_BEGIN = "<!-- study-table:begin (generated from benchmarks/results/study_cpu/summary.json) -->"
README_END = "<!-- study-table:end -->"
ARM_COLORS = {"baseline": "tab:blue", "mixture": "tab:gray", "aux0.5": "tab:orange", "aux1": "tab:red",
              "decoupled": "tab:green", "aux1+copy": "tab:purple", "sentinel": "tab:brown", "sentinel+aux1": "tab:pink"}


def _pm(stats: dict[str, Any], digits: int = 3) -> str:
    """'mean ± std' ('–' when missing; no ± for a single value)."""
    if stats.get("mean") is None:
        return "–"
    if stats.get("std") is None:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def _paired(stats: dict[str, Any], digits: int = 3) -> str:
    if stats.get("mean") is None:
        return "–"
    return f"{stats['mean']:+.{digits}f} ± {stats['std'] or 0:.{digits}f} ({stats['better_in']}/{stats['seeds']})"


def _efficiency(stats: dict[str, Any], seeds: int) -> str:
    if stats["n"] == 0:
        return f"not reached (0/{seeds})"
    text = _pm(stats, 2)
    return text if stats["n"] == seeds else f"{text} (reached in {stats['n']}/{seeds})"


def headline_table(summary: dict[str, Any]) -> str:
    """The README's table: per scale and arm, mean ± std over seeds (paired Δ vs the baseline, wins/seeds)."""
    lines = ["| scale | arm | val loss | Δ val loss vs baseline (better in) | LM-head val loss | copy acc. | "
             "passkey key-token acc. | tokens to baseline's final loss |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, scale in summary["scales"].items():
        m = scale["model"]
        scale_label = f"{name} (hidden {m['hidden']}, {m['layers']} layers, V {m['vocab']})"
        for arm, data in scale["arms"].items():
            ms, paired = data["mean_std"], data["paired_vs_baseline"]
            marker = " **(default)**" if arm == summary["decision"]["default"] else ""
            delta = "–" if arm == "baseline" else _paired(paired["val_loss"])
            lines.append(f"| {scale_label} | {arm}{marker} | {_pm(ms['val_loss'])} | {delta} | {_pm(ms['lm_val_loss'])} | "
                         f"{_pm(ms['copy_accuracy'])} | {_pm(ms['passkey_token_accuracy'])} | "
                         f"{_efficiency(ms['efficiency'], len(scale['seeds']))} |")
    return "\n".join(lines)


def readme_block(summary: dict[str, Any]) -> str:
    """The generated README block, between its markers."""
    return f"{README_BEGIN}\n{headline_table(summary)}\n{README_END}"


def _per_seed_table(scale: dict[str, Any]) -> list[str]:
    seeds = scale["seeds"]
    lines = ["| arm | " + " | ".join(f"seed {s}: val / LM-head val / copy / passkey tok. / efficiency" for s in seeds)
             + " |", "|---|" + "---:|" * len(seeds)]

    def cell(fig: dict[str, Any]) -> str:
        eff = "–" if fig["efficiency"] is None else f"{fig['efficiency']:.2f}"
        return (f"{fig['val_loss']:.3f} / {fig['lm_val_loss']:.3f} / {fig['copy_accuracy']:.3f} / "
                f"{fig['passkey_token_accuracy']:.3f} / {eff}")

    for arm, data in scale["arms"].items():
        lines.append(f"| {arm} | " + " | ".join(cell(data["per_seed"][str(s)]) for s in seeds) + " |")
    return lines


def _gradient_table(scale: dict[str, Any]) -> list[str]:
    lines = ["| arm | logit gradient outside the LM head's span | chance sqrt(1 - d/V) | retained energy / chance "
             "(d/V) | copy head's share of dL/dh (norms) | copy path's projection share <g_copy, g>/‖g‖² | "
             "cos(g_copy, g_lm) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for arm, data in scale["arms"].items():
        ms = data["mean_std"]
        get = (lambda k, d=3, ms=ms: _pm(ms.get(k, {}), d))  # noqa: E731
        lines.append(f"| {arm} | {get('logit_grad_outside_span', 4)} | {get('logit_grad_outside_span_chance', 4)} | "
                     f"{get('retained_over_chance', 2)} | {get('copy_grad_share')} | {get('copy_grad_projection')} | "
                     f"{get('copy_lm_grad_cosine')} |")
    return lines


def _interval(stats: dict[str, Any] | None) -> str:
    """'+m [lo, hi] (n seeds)' of a paired t-interval ('–' when missing)."""
    if not stats or stats.get("mean") is None:
        return "–"
    if stats.get("ci_low") is None:
        return f"{stats['mean']:+.3f} (no interval: {stats.get('n', 0)} seed)"
    return f"{stats['mean']:+.3f} [{stats['ci_low']:+.3f}, {stats['ci_high']:+.3f}]"


def _controls_table(scale: dict[str, Any]) -> list[str]:
    """The cache control beside every arm, the FLOPs efficiency and the paired intervals."""
    cache = scale.get("cache_control")
    lines = ["| arm | val loss (mean ± std) | Δ vs baseline, 95% paired interval | Δ vs baseline+cache, 95% paired "
             "interval | tokens to baseline's loss | training FLOPs to baseline's loss | copy acc.: mixture / copy head "
             "alone / mean gate |", "|---|---:|---:|---:|---:|---:|---:|"]
    seeds = len(scale["seeds"])
    if cache:
        lines.append(f"| baseline+cache (evaluation only) | {_pm(cache['mean_std']['val_loss'])} | "
                     f"{_interval(cache['paired_vs_baseline']['val_loss'])} | – | – | – | – |")
    for arm, data in scale["arms"].items():
        ms = data["mean_std"]
        base = "–" if arm == "baseline" else _interval(data["paired_vs_baseline"]["val_loss"])
        vs_cache = _interval(scale.get("vs_cache", {}).get(arm))
        copy_cells = " / ".join(_pm(ms.get(k, {})) for k in ("copy_accuracy", "copy_head_accuracy", "copy_mean_gate"))
        lines.append(f"| {arm} | {_pm(ms['val_loss'])} | {base} | {vs_cache} | {_efficiency(ms['efficiency'], seeds)} | "
                     f"{_efficiency(ms.get('efficiency_flops', {'n': 0}), seeds)} | {copy_cells} |")
    return lines


def _passkey_table(scale: dict[str, Any]) -> list[str]:
    lengths = sorted({int(n) for data in scale["arms"].values() for n in data["passkey_by_length"]})
    lines = ["| arm | " + " | ".join(f"length {n}" for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for arm, data in scale["arms"].items():
        by_length = data["passkey_by_length"]
        lines.append(f"| {arm} | " + " | ".join(
            f"{_pm(by_length[str(n)]['accuracy'], 2)} ({_pm(by_length[str(n)]['token_accuracy'], 2)})" for n in lengths)
            + " |")
    return lines


def write_study_report(output: Path, summary: dict[str, Any], spamlang: list[dict[str, Any]] | None = None) -> Path:
    """report.md and the plots under `output`; returns the report's path."""
    output = Path(output)
    plots = [_plot_curves(output, summary), _plot_final(output, summary), _plot_passkey(output, summary)]
    decision = summary["decision"]
    where = summary.get("where", "CPU")
    ran = (f"wall time {summary.get('wall_seconds', 0) / 60:.0f} min on 2 CPU cores (2 single-threaded runs at a "
           f"time)" if where == "CPU" else f"{where}, ~{summary.get('gpu_hours_estimated', 0):.0f} GPU-hours planned")
    lines = [
        f"# Recipe study: CPLM training objectives x seeds x scales ({where})", "",
        f"Command: `{summary.get('command', '')}`; {ran}.", "",
        "Every run of a seed and scale shares the backbone initialization and the data order; arms differ only in "
        "the copy head and its training objective. Val loss: `tools/evaluate.py --tasks val --val-all` on the last "
        "checkpoint, every sample of the clean validation split (generated and near-duplicate modules moved to "
        "train; see the corpus' split.json), of the model's full distribution (the mixture for CPLM); LM-head val "
        "loss: the LM head's own distribution on the same samples. baseline+cache: the baseline's checkpoint with "
        "a continuous cache (Grave et al. 2017) whose lambda/theta are tuned on the dev split. Copy/passkey/"
        "gradient: `tools/evaluate.py` on the last checkpoint. Efficiency: fraction of the baseline's training "
        "tokens (and training FLOPs, the copy head's counted) at which the run first reaches the baseline's final "
        "val loss on the trainer's periodic validation curve (< 1: faster). Mean ± sample std over seeds; Δ: paired "
        "difference vs the baseline of the same seed, (k/n) = better in k of n seeds; intervals: 95% Student t "
        "over seeds of the paired differences.", "",
        "## Arms", "",
    ]
    first = next(iter(summary["scales"].values()))
    for arm, data in first["arms"].items():
        overrides = ", ".join(f"`{o}`" for o in data["overrides"]) or "`copy_head.enabled=false`"
        lines.append(f"- **{arm}**: {data['description']} ({overrides})")
    from cplm_megatron.experiments.multiseed import ARMS

    retired = [a for a in ARMS.values() if a.retired and a.name not in first["arms"]]
    if retired:
        lines += ["", "Arms no longer run (the previous study dominated them):", ""]
        lines += [f"- **{a.name}**: {a.retired}" for a in retired]
    planned_scales = summary.get("planned_scales", list(SCALES))
    not_run = [s for s in planned_scales if s not in summary["scales"]]
    if not_run:
        lines += ["", "**Scales not run:** " + "; ".join(
            f"{s} (hidden {SCALES[s].hidden}, {SCALES[s].layers} layers, vocabulary {SCALES[s].vocab}, "
            f"{SCALES[s].iters} steps)" if s in SCALES else s for s in not_run)
            + ". The decision below rests on the scales that ran only."]
    lines += ["", "## Decision", "", f"Rule: {summary['rule']}", "",
              f"**Default: {decision['default']}** ({', '.join(f'`{o}`' for o in decision['overrides'])}). "
              f"{decision['reason']}.", ""]
    if decision.get("provisional"):
        lines += [f"**Provisional**: {decision['planned_runs_missing']} of the {decision['planned_runs']} runs of the "
                  f"planned grid are not in this summary.", ""]
    lines += ["## Results", "", headline_table(summary), ""]
    for name, scale in summary["scales"].items():
        m, flat = scale["model"], scale["baseline_flattening"]
        at = ", ".join(f"{k}: {v:.3f}" for k, v in flat["mean_val_loss_at"].items())
        lines += [f"### Scale {name}: hidden {m['hidden']}, {m['layers']} layers, vocabulary {m['vocab']}, "
                  f"{m['iters']} steps ({scale['tokens'] / 1e6:.2f}M tokens), seeds {scale['seeds']}", "",
                  f"Baseline val loss (mean over seeds) at {at} of training; it improved by "
                  f"{100 * flat['relative_improvement_last_quarter']:.1f}% over the last quarter (the WSD schedule's "
                  f"decay covers the last 20%). Baseline copy accuracy: {_pm(scale.get('baseline_copy_accuracy', {}))}"
                  f" (0 means the comparison is a copy mechanism against none learned yet).", "",
                  "Controls, intervals and costs:", "", *_controls_table(scale), "",
                  "Per seed:", "", *_per_seed_table(scale), "",
                  "Passkey retrieval by context length (whole key, key tokens in parentheses; mean ± std over seeds, "
                  "averaged over needle depths; trained at 256 tokens):", "", *_passkey_table(scale), "",
                  "Gradient figures (a validation batch, last checkpoint):", "", *_gradient_table(scale), ""]
    if spamlang:
        lines += ["## SpamLang at vocabulary >= 100k (Godey & Artzi's regime)", "",
                  f"Baseline vs the chosen default ({decision['default']}), untied LM head.", "",
                  "| hidden | vocab | CPLM: steps to >= 99% | baseline: steps to >= 99% | final acc. CPLM / baseline | "
                  "p(target) CPLM / baseline |", "|---:|---:|---:|---:|---:|---:|"]
        for c in spamlang:
            base = c["baseline_steps_to_99"]
            cplm_acc = c["cplm_accuracy"][max(c["cplm_accuracy"], key=int)]
            base_acc = c["baseline_accuracy"][max(c["baseline_accuracy"], key=int)]
            lines.append(f"| {c['hidden']} | {c['vocab']} | {c['cplm_steps_to_99']} | "
                         f"{base if base is not None else 'not within ' + str(c['iters'])} | {cplm_acc:.3f} / "
                         f"{base_acc:.3f} | {c['cplm_final_target_prob']:.3g} / {c['baseline_final_target_prob']:.3g} |")
        lines.append("")
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots if p is not None] + [""]
    report = output / "report.md"
    report.write_text("\n".join(lines))
    return report


def _per_scale_figure(summary: dict[str, Any], rows: int, height: float):
    names = list(summary["scales"])
    fig, axes = plt.subplots(rows, len(names), figsize=(6 * len(names), height * rows), squeeze=False)
    return fig, axes, names


def _band(ax, xs, per_seed: list[list[float]], color: str, label: str) -> None:
    import numpy as np

    values = np.array(per_seed)
    mean, std = values.mean(axis=0), values.std(axis=0, ddof=1) if len(per_seed) > 1 else 0 * values[0]
    ax.plot(xs, mean, color=color, label=label)
    ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.2)


def _plot_curves(output: Path, summary: dict[str, Any]) -> Path:
    fig, axes, names = _per_scale_figure(summary, 2, 4.0)
    for col, name in enumerate(names):
        scale = summary["scales"][name]
        for row, key in enumerate(("val_loss", "lm_val_loss")):
            ax = axes[row][col]
            for arm, data in scale["arms"].items():
                curves = [data["per_seed"][str(s)]["val_curve"] for s in scale["seeds"]]
                xs = [p["tokens"] / 1e6 for p in curves[0]]
                _band(ax, xs, [[p[key] for p in c] for c in curves], ARM_COLORS.get(arm, "black"), arm)
            ax.set_title(f"{name}: {'val loss (full distribution)' if key == 'val_loss' else 'LM-head val loss'}")
            ax.set_xlabel("training tokens (M)")
            ax.set_ylabel("nats/token")
            lows = [data["mean_std"][key]["mean"] for data in scale["arms"].values()]
            ax.set_ylim(min(lows) - 0.3, min(lows) + 2.5)
            ax.legend(fontsize=8)
    return _save(fig, output / "val_loss_curves.png")


def _plot_final(output: Path, summary: dict[str, Any]) -> Path:
    keys = (("val_loss", "val loss"), ("lm_val_loss", "LM-head val loss"), ("copy_accuracy", "copy accuracy"),
            ("passkey_token_accuracy", "passkey key-token acc."))
    fig, axes, names = _per_scale_figure(summary, len(keys), 2.6)
    for col, name in enumerate(names):
        arms = summary["scales"][name]["arms"]
        for row, (key, title) in enumerate(keys):
            ax = axes[row][col]
            stats = [arms[a]["mean_std"][key] for a in arms]
            ax.bar(list(arms), [s["mean"] or 0 for s in stats], yerr=[s["std"] or 0 for s in stats], capsize=4,
                   color=[ARM_COLORS.get(a, "black") for a in arms])
            ax.set_title(f"{name}: {title} (mean ± std)")
            if key.endswith("loss"):
                low = min(s["mean"] for s in stats)
                ax.set_ylim(low - 0.5, max(s["mean"] for s in stats) + 0.3)
    return _save(fig, output / "final_metrics.png")


def _plot_passkey(output: Path, summary: dict[str, Any]) -> Path:
    fig, axes, names = _per_scale_figure(summary, 1, 4.0)
    for col, name in enumerate(names):
        ax = axes[0][col]
        for arm, data in summary["scales"][name]["arms"].items():
            lengths = sorted(data["passkey_by_length"], key=int)
            means = [data["passkey_by_length"][n]["token_accuracy"]["mean"] for n in lengths]
            stds = [data["passkey_by_length"][n]["token_accuracy"]["std"] or 0 for n in lengths]
            ax.errorbar([int(n) for n in lengths], means, yerr=stds, capsize=3, marker="o", label=arm,
                        color=ARM_COLORS.get(arm, "black"))
        ax.set_xscale("log", base=2)
        ax.set_title(f"{name}: passkey key-token accuracy vs context length")
        ax.set_xlabel("context length (trained at 256)")
        ax.legend(fontsize=8)
    return _save(fig, output / "passkey_by_length.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

