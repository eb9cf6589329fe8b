"""The recipe study's report: report.md, PNG plots with error bands, and the README's headline table.

Input: the body of summary.json (`cplm_megatron.experiments.study.summary.summarize`) plus the command
and wall time. Plots: val_loss_curves.png (full distribution and LM head, mean ± std over seeds vs tokens),
train_nll_curves.png (the training NLL of the output distribution for every arm, the objective's auxiliary
term apart), final_metrics.png (bars with ± std), passkey_by_length.png (first key token).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.study.plan import SCALES
from cplm_megatron.experiments.toolkit import band, interval, plt, pm, save, table

README_BEGIN = "<!-- study-table:begin (generated from results/study_cpu_v3/summary.json) -->"
README_END = "<!-- study-table:end -->"
ARM_COLORS = {"baseline": "tab:blue", "mixture": "tab:gray", "aux0.5": "tab:orange", "aux1": "tab:red",
              "decoupled": "tab:green", "aux1+copy": "tab:purple", "sentinel": "tab:brown", "sentinel+aux1": "tab:pink"}


def _efficiency(stats: dict[str, Any], seeds: int) -> str:
    if stats["n"] == 0:
        return f"not reached (0/{seeds})"
    text = pm(stats, 2)
    return text if stats["n"] == seeds else f"{text} (reached in {stats['n']}/{seeds})"


def _chance(summary: dict[str, Any], key: str) -> str:
    """A chance value recorded by the runs (the same vocabulary at every scale), for a column header."""
    values = {data["mean_std"].get(key, {}).get("mean") for scale in summary["scales"].values()
              for data in scale["arms"].values()} - {None}
    return "chance " + " / ".join(f"{v:.1e}" for v in sorted(values)) if values else "chance –"


def _one_token_match(summary: dict[str, Any]) -> str:
    """The one-token-match copier's copy accuracy (per scale where they differ), for a column header."""
    values = {(scale.get("copy_controls") or {}).get("copy_accuracy_one_token_match")
              for scale in summary["scales"].values()} - {None}
    return "one-token-match copier " + " / ".join(f"{v:.3f}" for v in sorted(values)) if values else ""


def headline_table(summary: dict[str, Any]) -> str:
    """The README's table: per scale and arm, mean ± std over seeds and the paired differences against the baseline
    and the baseline + cache control (95% t-interval over seeds, better in k of n seeds); chance values in headers."""
    header = ["scale", "arm", "val loss", "Δ vs baseline [95% t over seeds] (better in)",
              "Δ vs baseline+cache [95% t] (better in)", "LM-head val loss",
              f"copy acc. ({'; '.join(x for x in (_chance(summary, 'copy_accuracy_chance'), _one_token_match(summary)) if x)})",
              f"passkey first-key-token acc. ({_chance(summary, 'passkey_first_token_chance')})",
              "tokens to baseline's final loss"]
    rows = []
    for name, scale in summary["scales"].items():
        m = scale["model"]
        scale_label = f"{name} (hidden {m['hidden']}, {m['layers']} layers, V {m['vocab']})"
        cache = scale.get("cache_control")
        if cache:
            rows.append([scale_label, "baseline+cache (control)", pm(cache["mean_std"]["val_loss"]),
                         _wins(cache["paired_vs_baseline"]["val_loss"]), *["–"] * 5])
        for arm, data in scale["arms"].items():
            ms = data["mean_std"]
            marker = " **(default)**" if arm == summary["decision"]["default"] else ""
            base = "–" if arm == "baseline" else _wins(scale.get("vs_baseline", {}).get(arm))
            vs_cache = "–" if arm == "baseline" else _wins(scale.get("vs_cache", {}).get(arm))
            rows.append([scale_label, f"{arm}{marker}", pm(ms["val_loss"]), base, vs_cache, pm(ms["lm_val_loss"]),
                         pm(ms["copy_accuracy"]), pm(ms.get("passkey_first_token_accuracy", {})),
                         _efficiency(ms["efficiency"], len(scale["seeds"]))])
    return "\n".join(table(header, rows, "ll" + "r" * 7))


def _wins(stats: dict[str, Any] | None) -> str:
    """'+m [lo, hi] (k/n)': a paired difference over seeds, its t-interval and in how many seeds it is below 0."""
    if not stats or stats.get("mean") is None:
        return "–"
    per_seed = list(stats.get("per_seed", {}).values())
    return f"{interval(stats)} ({sum(d < 0 for d in per_seed)}/{len(per_seed)})"


def readme_block(summary: dict[str, Any]) -> str:
    """The generated README block, between its markers."""
    return f"{README_BEGIN}\n{headline_table(summary)}\n{README_END}"


def _per_seed_table(scale: dict[str, Any]) -> list[str]:
    seeds = scale["seeds"]
    header = ["arm", *(f"seed {s}: val / LM-head val / copy / passkey first key token / efficiency" for s in seeds)]

    def cell(fig: dict[str, Any]) -> str:
        eff = "–" if fig["efficiency"] is None else f"{fig['efficiency']:.2f}"
        first = fig.get("passkey_first_token_accuracy")
        return (f"{fig['val_loss']:.3f} / {fig['lm_val_loss']:.3f} / {fig['copy_accuracy']:.3f} / "
                f"{'–' if first is None else f'{first:.3f}'} / {eff}")

    rows = [[arm, *(cell(data["per_seed"][str(s)]) if str(s) in data["per_seed"] else "–" for s in seeds)]
            for arm, data in scale["arms"].items()]
    return table(header, rows, "l" + "r" * len(seeds))


def _gradient_table(scale: dict[str, Any]) -> list[str]:
    header = ["arm", "logit gradient outside the LM head's span", "chance sqrt(1 - d/V)",
              "retained energy / chance (d/V)", "copy head's share of dL/dh (norms)",
              "copy path's projection share <g_copy, g>/‖g‖²", "cos(g_copy, g_lm)"]
    digits = {"logit_grad_outside_span": 4, "logit_grad_outside_span_chance": 4, "retained_over_chance": 2,
              "copy_grad_share": 3, "copy_grad_projection": 3, "copy_lm_grad_cosine": 3}
    rows = [[arm, *(pm(data["mean_std"].get(key, {}), d) for key, d in digits.items())]
            for arm, data in scale["arms"].items()]
    return table(header, rows, "l" + "r" * 6)


def _controls_table(scale: dict[str, Any]) -> list[str]:
    """The cache control beside every arm, the FLOPs efficiency and the paired intervals."""
    cache = scale.get("cache_control")
    header = ["arm", "val loss (mean ± std)", "Δ vs baseline, 95% paired interval",
              "Δ vs baseline+cache, 95% paired interval", "tokens to baseline's loss",
              "training FLOPs to baseline's loss", "copy acc.: mixture / copy head alone / mean gate"]
    seeds = len(scale["seeds"])
    rows = []
    if cache:
        rows.append(["baseline+cache (evaluation only)", pm(cache["mean_std"]["val_loss"]),
                     interval(cache["paired_vs_baseline"]["val_loss"]), *["–"] * 4])
    for arm, data in scale["arms"].items():
        ms = data["mean_std"]
        base = "–" if arm == "baseline" else interval(data["paired_vs_baseline"]["val_loss"])
        vs_cache = interval(scale.get("vs_cache", {}).get(arm))
        copy_cells = " / ".join(pm(ms.get(k, {})) for k in ("copy_accuracy", "copy_head_accuracy", "copy_mean_gate"))
        rows.append([arm, pm(ms["val_loss"]), base, vs_cache, _efficiency(ms["efficiency"], seeds),
                     _efficiency(ms.get("efficiency_flops", {"n": 0}), seeds), copy_cells])
    return table(header, rows, "l" + "r" * 6)


def _comparisons_table(scale: dict[str, Any]) -> list[str]:
    """Every paired comparison of a scale: per-seed differences (each with its document-bootstrap interval) and the
    t-interval over seeds, the primary figure."""
    header = ["comparison (val loss, nats)", "per seed: difference [document bootstrap 95%]",
              "mean [95% t over seeds]"]
    comparisons = [(f"{a} - baseline", v) for a, v in scale.get("vs_baseline", {}).items()]
    comparisons += [(f"{a} - (baseline+cache)", v) for a, v in scale.get("vs_cache", {}).items()]
    comparisons += list(scale.get("between_arms", {}).items())
    rows = []
    for name, stats in comparisons:
        docs = stats.get("document_interval_per_seed", {})
        seeds = "; ".join(f"s{seed}: {d:+.3f}" + (f" [{docs[seed][1]:+.3f}, {docs[seed][2]:+.3f}]" if docs.get(seed)
                                                  else "") for seed, d in stats["per_seed"].items())
        rows.append([name, seeds or "–", interval(stats)])
    return table(header, rows, "llr")


def _passkey_table(scale: dict[str, Any]) -> list[str]:
    lengths = sorted({int(n) for data in scale["arms"].values() for n in data["passkey_by_length"]})

    def cell(at: dict[str, Any]) -> str:
        return f"{pm(at.get('first_token_accuracy', {}), 2)} ({pm(at['token_accuracy'], 2)})"

    rows = [[arm, *(cell(data["passkey_by_length"][str(n)]) for n in lengths)] for arm, data in scale["arms"].items()]
    return table(["arm", *(f"length {n}" for n in lengths)], rows, "l" + "r" * len(lengths))


def _copy_control_text(scale: dict[str, Any]) -> str:
    """The per-scale sentence on the copy task's controls."""
    controls = scale.get("copy_controls")
    if not controls:
        return ""
    return (f" On the same copy samples the one-token-match copier scores "
            f"{controls['copy_accuracy_one_token_match']:.3f} (chance {controls['copy_accuracy_chance']:.1e}): every "
            f"arm's copy accuracy below it copies no better than matching the current token alone.")


def spamlang_lines(spamlang: list[dict[str, Any]], default: str) -> list[str]:
    """The SpamLang section: per hidden size and seed, the CPLM beside the baseline and the trivial copiers."""
    rows, left = [], 0
    for c in spamlang:
        last = max(c["cplm_accuracy"], key=int)
        cache = c.get("baseline_cache_accuracy") or {}
        loss = c.get("baseline_final_loss")
        ln_v = c.get("ln_vocab") or math.log(c["vocab"])
        left += loss is not None and loss < ln_v - 0.1
        base = c["baseline_steps_to_99"]
        rows.append([str(c["hidden"]), str(c["vocab"]), str(c.get("seed", "–")), str(c["iters"]),
                     str(c["cplm_steps_to_99"]), str(base) if base is not None else f"not within {c['iters']}",
                     f"{c['cplm_accuracy'][last]:.3f} / {c['baseline_accuracy'][last]:.3f}",
                     "–" if c.get("previous_token_accuracy") is None else f"{c['previous_token_accuracy']:.3f}",
                     " / ".join("–" if not cache else f"{cache[k]:.3f}" for k in (min(cache, key=int, default=None),
                                                                                  max(cache, key=int, default=None))),
                     "–" if loss is None else f"{loss:.3f} / {ln_v:.3f}",
                     f"{c['cplm_final_target_prob']:.3g} / {c['baseline_final_target_prob']:.3g}"])
    lines = ["## SpamLang at vocabulary >= 100k (Godey & Artzi's regime)", "",
             f"Baseline vs the chosen default ({default}), untied LM head, beside the trivial copiers on the same "
             "samples: the previous-token copier and the baseline + continuous cache (lambda/theta tuned on other "
             "SpamLang samples). The CPLM's (L-1)/L = 0.992 is reached at initialization by construction, and so is "
             "the baseline + cache's.", ""]
    lines += table(["hidden", "vocab", "seed", "steps", "CPLM: steps to >= 99%", "baseline: steps to >= 99%",
                    "final acc. CPLM / baseline", "previous-token copier", "baseline + cache: step 0 / final",
                    "baseline final loss / ln V", "p(target) CPLM / baseline"], rows, "r" * 11)
    lines += ["", f"The baseline's loss fell more than 0.1 nats below ln V in {left} of {len(spamlang)} runs; the "
              f"per-step figures are in each spamlang_h<hidden>_s<seed>/report.md.", ""]
    return lines


def write_study_report(output: Path, summary: dict[str, Any], spamlang: list[dict[str, Any]] | None = None) -> Path:
    """report.md and the plots under `output`; returns the report's path."""
    output = Path(output)
    plots = [_plot_curves(output, summary), _plot_train_nll(output, summary), _plot_final(output, summary),
             _plot_passkey(output, summary)]
    decision = summary["decision"]
    where = summary.get("where", "CPU")
    ran = (f"{summary.get('run_seconds_total', 0) / 60:.0f} min of run time (training + evaluation) summed over "
           f"{summary.get('runs_with_timing', 0)} timed runs, each single-threaded (runs reused from earlier "
           f"invocations keep their own times); this invocation ran {summary.get('jobs', 1)} at a time for "
           f"{summary.get('seconds_this_invocation', 0) / 60:.0f} min" if where == "CPU"
           else f"{where}, ~{summary.get('gpu_hours_estimated', 0):.0f} GPU-hours planned")
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
        "difference vs the baseline (or the baseline + cache) of the same seed, (k/n) = better in k of n seeds; "
        "intervals: 95% Student t over seeds of the per-seed paired differences (the primary figure: it includes "
        "the seed-to-seed spread), with each seed's document-bootstrap interval beside it (validation-set noise "
        "only). Passkey: accuracy on the first key token, the one that needs retrieval (the others are copyable "
        "bigrams under teacher forcing), beside its chance value; copy accuracy beside its chance value and the "
        "one-token-match copier's (it predicts the current token's most frequent earlier successor, on the same "
        "samples).", "",
        "## Arms", "",
    ]
    first = next(iter(summary["scales"].values()))
    for arm, data in first["arms"].items():
        overrides = ", ".join(f"`{o}`" for o in data["overrides"]) or "`copy_head.enabled=false`"
        lines.append(f"- **{arm}**: {data['description']} ({overrides})")
    from cplm_megatron.experiments.study.plan import ARMS

    retired = [a for a in ARMS.values() if a.retired and a.name not in first["arms"]]
    if retired:
        lines += ["", "Arms no longer run by default (with the reason):", ""]
        lines += [f"- **{a.name}**: {a.retired}" for a in retired]
    planned_scales = summary.get("planned_scales", list(SCALES))
    not_run = [s for s in planned_scales if s not in summary["scales"]]
    if not_run:
        lines += ["", "**Scales not run:** " + "; ".join(
            f"{s} (hidden {SCALES[s].hidden}, {SCALES[s].layers} layers, vocabulary {SCALES[s].vocab}, "
            f"{SCALES[s].iters} steps)" if s in SCALES else s for s in not_run)
            + ". The decision below rests on the scales that ran only."]
    overrides = ", ".join(f"`{o}`" for o in decision["overrides"]) or "`copy_head.enabled=false`"
    lines += ["", "## Decision", "", f"Rule: {summary['rule']}", "",
              f"**Default: {decision['default']}** ({overrides}). {decision['reason']}.", ""]
    lines += [f"- {arm}: not credited: {why}" for arm, why in decision.get("not_credited", {}).items()]
    lines += [f"- {step}" for step in decision.get("steps", [])]
    check = summary.get("second_scale_check")
    if check:
        lines += ["", f"The later scales' arms {check['later_scales']} " +
                  ("are" if check["match"] else "are NOT") + f" the two best arms of {check['first_scale']} so far "
                  f"({', '.join(check['two_best'])}, by the mean paired difference against the cache control)."]
    if decision.get("provisional"):
        lines += ["", f"**Provisional**: {decision['planned_runs_missing']} of the {decision['planned_runs']} runs of "
                  f"the planned grid are not in this summary"
                  + (f" (scales not started: {', '.join(decision['scales_not_started'])})"
                     if decision.get("scales_not_started") else "") + "."]
    lines += [""]
    lines += ["## Results", "", headline_table(summary), ""]
    for name, scale in summary["scales"].items():
        m, flat = scale["model"], scale["baseline_flattening"]
        at = ", ".join(f"{k}: {v:.3f}" for k, v in flat["mean_val_loss_at"].items())
        lines += [f"### Scale {name}: hidden {m['hidden']}, {m['layers']} layers, vocabulary {m['vocab']}, "
                  f"{m['iters']} steps ({scale['tokens'] / 1e6:.2f}M tokens), seeds {scale['seeds']}", "",
                  f"Baseline val loss (mean over seeds) at {at} of training; it improved by "
                  f"{100 * flat['relative_improvement_last_quarter']:.1f}% over the last quarter (the WSD schedule's "
                  f"decay covers the last 20%). Baseline copy accuracy: {pm(scale.get('baseline_copy_accuracy', {}))}"
                  f" (0 means the comparison is a copy mechanism against none learned yet)." + _copy_control_text(scale),
                  "",
                  "Controls, intervals and costs:", "", *_controls_table(scale), "",
                  "Paired comparisons:", "", *_comparisons_table(scale), "",
                  "Per seed:", "", *_per_seed_table(scale), "",
                  "Passkey retrieval by context length (first key token, all key tokens in parentheses; mean ± std "
                  "over seeds, averaged over needle depths; trained at 256 tokens; chance for the first key token: "
                  f"{_chance({'scales': {name: scale}}, 'passkey_first_token_chance')}):", "",
                  *_passkey_table(scale), "",
                  "Gradient figures (a validation batch, last checkpoint):", "", *_gradient_table(scale), ""]
    if spamlang:
        lines += spamlang_lines(spamlang, decision["default"])
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots if p is not None] + [""]
    report = output / "report.md"
    report.write_text("\n".join(lines))
    return report


def _per_scale_figure(summary: dict[str, Any], rows: int, height: float):
    names = list(summary["scales"])
    fig, axes = plt.subplots(rows, len(names), figsize=(6 * len(names), height * rows), squeeze=False)
    return fig, axes, names


def _plot_curves(output: Path, summary: dict[str, Any]) -> Path:
    fig, axes, names = _per_scale_figure(summary, 2, 4.0)
    for col, name in enumerate(names):
        scale = summary["scales"][name]
        for row, key in enumerate(("val_loss", "lm_val_loss")):
            ax = axes[row][col]
            for arm, data in scale["arms"].items():
                curves = [fig["val_curve"] for fig in data["per_seed"].values()]
                xs = [p["tokens"] / 1e6 for p in curves[0]]
                band(ax, xs, [[p[key] for p in c] for c in curves], ARM_COLORS.get(arm, "black"), arm)
            ax.set_title(f"{name}: {'val loss (full distribution)' if key == 'val_loss' else 'LM-head val loss'}")
            ax.set_xlabel("training tokens (M)")
            ax.set_ylabel("nats/token")
            lows = [data["mean_std"][key]["mean"] for data in scale["arms"].values()]
            ax.set_ylim(min(lows) - 0.3, min(lows) + 2.5)
            ax.legend(fontsize=8)
    return save(fig, output / "val_loss_curves.png")


def _plot_train_nll(output: Path, summary: dict[str, Any]) -> Path:
    """Training NLL of the output distribution (the mixture for CPLM, comparable across arms) and, apart, the
    CPLM objective's terms (mixture NLL, the LM head's auxiliary cross entropy), mean over seeds."""
    fig, axes, names = _per_scale_figure(summary, 2, 4.0)
    for col, name in enumerate(names):
        scale = summary["scales"][name]
        for arm, data in scale["arms"].items():
            curves = [data["per_seed"][s]["train_curve"] for s in data["per_seed"]]
            if not curves or not curves[0]:
                continue
            xs = [p["tokens"] / 1e6 for p in curves[0]]
            color = ARM_COLORS.get(arm, "black")
            band(axes[0][col], xs, [[p["nll"] for p in c] for c in curves], color, arm)
            if arm != "baseline":
                band(axes[1][col], xs, [[p["lm_loss"] for p in c] for c in curves], color, f"{arm}: LM head CE")
        axes[0][col].set_title(f"{name}: training NLL of the output distribution (mixture for CPLM)")
        axes[1][col].set_title(f"{name}: CPLM objective's auxiliary term (the LM head's own CE)")
        for ax in axes[:, col]:
            ax.set_xlabel("training tokens (M)")
            ax.set_ylabel("nats/token")
            ax.legend(fontsize=8)
    return save(fig, output / "train_nll_curves.png")


def _plot_final(output: Path, summary: dict[str, Any]) -> Path:
    keys = (("val_loss", "val loss"), ("lm_val_loss", "LM-head val loss"), ("copy_accuracy", "copy accuracy"),
            ("passkey_first_token_accuracy", "passkey first-key-token acc."))
    fig, axes, names = _per_scale_figure(summary, len(keys), 2.6)
    for col, name in enumerate(names):
        arms = summary["scales"][name]["arms"]
        for row, (key, title) in enumerate(keys):
            ax = axes[row][col]
            stats = [arms[a]["mean_std"].get(key, {"mean": None, "std": None}) for a in arms]
            ax.bar(list(arms), [s["mean"] or 0 for s in stats], yerr=[s["std"] or 0 for s in stats], capsize=4,
                   color=[ARM_COLORS.get(a, "black") for a in arms])
            ax.set_title(f"{name}: {title} (mean ± std)")
            present = [s["mean"] for s in stats if s["mean"] is not None]
            if key.endswith("loss") and present:
                ax.set_ylim(min(present) - 0.5, max(present) + 0.3)
    return save(fig, output / "final_metrics.png")


def _plot_passkey(output: Path, summary: dict[str, Any]) -> Path:
    fig, axes, names = _per_scale_figure(summary, 1, 4.0)
    for col, name in enumerate(names):
        ax = axes[0][col]
        for arm, data in summary["scales"][name]["arms"].items():
            lengths = sorted(data["passkey_by_length"], key=int)
            stats = [data["passkey_by_length"][n].get("first_token_accuracy") or {} for n in lengths]
            means = [st.get("mean") or 0 for st in stats]
            stds = [st.get("std") or 0 for st in stats]
            ax.errorbar([int(n) for n in lengths], means, yerr=stds, capsize=3, marker="o", label=arm,
                        color=ARM_COLORS.get(arm, "black"))
        ax.set_xscale("log", base=2)
        chance = _chance({"scales": {name: summary["scales"][name]}}, "passkey_first_token_chance")
        ax.set_title(f"{name}: passkey first-key-token accuracy ({chance})")
        ax.set_xlabel("context length (trained at 256)")
        ax.legend(fontsize=8)
    return save(fig, output / "passkey_by_length.png")
