"""The ablation report: `report.md` with results tables and PNG plots (matplotlib, Agg backend).

Input: finished runs (cplm_megatron.experiments.records.RunResults), grouped in baseline/CPLM pairs.
Plots: loss_curves.png, copy_accuracy.png (copy and SpamLang accuracy vs steps), passkey.png
(the loss on the key tokens at each operating point of the last checkpoints), gradient_retention.png (the logit
gradient's share inside the LM head's span beside its chance value). A plot without data is skipped.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.records import RunResults, read_timing
from cplm_megatron.experiments.toolkit import fmt, grid, prob, save, table

SPAMLANG_TARGET = 0.99


def first_reaching(iterations: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """The first evaluated iteration whose value is >= threshold (None: never)."""
    return next((it for it, v in zip(iterations, values) if v >= threshold), None)


def staying_from(iterations: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """The first evaluated iteration from which every later value is >= threshold (None: not at the end)."""
    start = None
    for it, v in zip(iterations, values):
        if v < threshold:
            start = None
        elif start is None:
            start = it
    return start


@dataclass
class PairSummary:
    """Baseline vs CPLM of one group, side by side."""

    group: str
    baseline: RunResults
    cplm: RunResults


def pair_up(runs: Sequence[RunResults]) -> list[PairSummary]:
    """Group runs into (baseline, CPLM) pairs, in plan order."""
    by_group: dict[str, dict[bool, RunResults]] = {}
    for run in runs:
        by_group.setdefault(run.spec.group, {})[run.spec.copy_head] = run
    pairs = []
    for group, members in by_group.items():
        if set(members) != {False, True}:
            raise ValueError(f"group {group} lacks its {'CPLM' if False in members else 'baseline'} run")
        pairs.append(PairSummary(group, members[False], members[True]))
    return pairs
COLORS = {False: "tab:blue", True: "tab:red"}
NAMES = {False: "baseline", True: "CPLM"}


def _metric(run: RunResults, task: str, metric: str, entry: dict | None = None) -> float | None:
    entry = entry or run.final
    return entry["tasks"].get(task, {}).get("metrics", {}).get(metric)


def _at(run: RunResults, iteration: int) -> dict | None:
    return next((e for e in run.checkpoints if e["iteration"] == iteration), None)


# -------------------------------------------------------------------------------------- SpamLang


def _curve(run: RunResults, metric: str) -> dict[int, float]:
    """{iteration: value} of one SpamLang metric over the evaluated checkpoints (absent where not evaluated: runs
    scored before the metric existed)."""
    return {e["iteration"]: e["tasks"]["spamlang"]["metrics"][metric] for e in run.checkpoints
            if metric in e["tasks"].get("spamlang", {}).get("metrics", {})}


def spamlang_claims(pairs: Sequence[PairSummary]) -> list[dict[str, Any]]:
    """Per SpamLang pair: steps to >= 99% accuracy for both models, the baseline's accuracy at the CPLM's step, the
    trivial copiers on the same samples (previous token; the baseline + continuous cache) and the losses vs ln V."""
    claims = []
    for pair in pairs:
        if pair.cplm.spec.experiment != "spamlang":
            continue
        its_c, acc_c = pair.cplm.eval_curve("spamlang", "spamlang_accuracy")
        its_b, acc_b = pair.baseline.eval_curve("spamlang", "spamlang_accuracy")
        prob_c = pair.cplm.eval_curve("spamlang", "spamlang_target_prob")
        prob_b = pair.baseline.eval_curve("spamlang", "spamlang_target_prob")
        cplm_step = first_reaching(its_c, acc_c, SPAMLANG_TARGET)
        base_step = first_reaching(its_b, acc_b, SPAMLANG_TARGET)
        at = _at(pair.baseline, cplm_step) if cplm_step is not None else None
        label = pair.cplm.spec.label
        previous = _curve(pair.baseline, "spamlang_accuracy_previous_token")
        claims.append({
            "group": pair.group, "vocab": label["vocab"], "hidden": label["hidden"], "tied": label["tied"],
            "iters": label["iters"], "seed": dict(pair.cplm.spec.settings).get("run.seed"),
            "checkpoint_steps": its_c,
            "cplm_steps_to_99": cplm_step, "baseline_steps_to_99": base_step,
            "cplm_stays_99_from": staying_from(its_c, acc_c, SPAMLANG_TARGET),
            "baseline_stays_99_from": staying_from(its_b, acc_b, SPAMLANG_TARGET),
            "cplm_accuracy": dict(zip(its_c, acc_c)), "baseline_accuracy": dict(zip(its_b, acc_b)),
            "cplm_target_prob": dict(zip(*prob_c)), "baseline_target_prob": dict(zip(*prob_b)),
            "baseline_accuracy_at_cplm_step": _metric(pair.baseline, "spamlang", "spamlang_accuracy", at) if at else None,
            "cplm_final_loss": _metric(pair.cplm, "spamlang", "spamlang_loss"),
            "baseline_final_loss": _metric(pair.baseline, "spamlang", "spamlang_loss"),
            "cplm_final_target_prob": _metric(pair.cplm, "spamlang", "spamlang_target_prob"),
            "baseline_final_target_prob": _metric(pair.baseline, "spamlang", "spamlang_target_prob"),
            "ln_vocab": math.log(label["vocab"]), "baseline_loss": _curve(pair.baseline, "spamlang_loss"),
            "previous_token_accuracy": previous[max(previous)] if previous else None,
            "baseline_cache_accuracy": _curve(pair.baseline, "spamlang_accuracy_cache"),
            "baseline_cache_lambda": _curve(pair.baseline, "spamlang_cache_lambda"),
        })
    return claims


def _steps(step: int | None, iters: int) -> str:
    return f"{step}" if step is not None else f"not within {iters}"


def _stays(step: int | None, iters: int) -> str:
    return f"{step}" if step is not None else f"below at step {iters}"


def _per_step_table(claims: list[dict], title: str, cells: Callable[[dict, int], str]) -> list[str]:
    """One row per SpamLang run, one column per evaluated step."""
    steps = claims[0]["checkpoint_steps"]
    rows = [[str(c["vocab"]), str(c.get("seed", "–")), *(cells(c, s) for s in c["checkpoint_steps"])] for c in claims]
    return ["", title, "", *table(["vocab", "seed", *(f"step {s}" for s in steps)], rows, "rr" + "r" * len(steps))]


def _ln_v(c: dict) -> str:
    """The baseline's final loss against ln V."""
    if c["baseline_final_loss"] is None:
        return "–"
    return f"{c['baseline_final_loss']:.3f} / {math.log(c['vocab']):.3f}"


def spamlang_section(pairs: Sequence[PairSummary]) -> list[str]:
    claims = spamlang_claims(pairs)
    if not claims:
        return []
    lines = ["## SpamLang at a vocabulary >= 64x the hidden size", "",
             ("Each sequence repeats one random symbol (Godey & Artzi). Accuracy = argmax next-token accuracy over "
             "every position (position 0 included: nothing to copy there), evaluated on the untrained model (step 0) "
             "and every checkpoint. `p(target)`: mean probability of the right symbol at the last checkpoint. Beside "
             "them, on the same samples, the trivial copiers: the previous-token copier (predicts the token it was "
             "just given) and the baseline + continuous cache (Grave et al. 2017; lambda/theta tuned for NLL on "
             "other SpamLang samples; no training of a copy mechanism)."), ""]
    header = ["vocab", "V/d", "seed", "LM head", "steps to 99%: CPLM / baseline", "final acc. CPLM / baseline",
              "previous-token copier", "baseline + cache at step 0 / final", "baseline final loss / ln V",
              "p(target) CPLM / baseline"]
    rows = []
    for c in claims:
        last = max(c["cplm_accuracy"])
        cache = c.get("baseline_cache_accuracy") or {}
        rows.append([str(c["vocab"]), str(c["vocab"] // c["hidden"]), str(c.get("seed", "–")),
                     "tied" if c["tied"] else "untied",
                     f"{_steps(c['cplm_steps_to_99'], c['iters'])} / {_steps(c['baseline_steps_to_99'], c['iters'])}",
                     f"{fmt(c['cplm_accuracy'][last])} / {fmt(c['baseline_accuracy'].get(last))}",
                     fmt(c.get("previous_token_accuracy")),
                     f"{fmt(cache.get(min(cache)) if cache else None)} / {fmt(cache.get(max(cache)) if cache else None)}",
                     _ln_v(c), f"{prob(c['cplm_final_target_prob'])} / {prob(c['baseline_final_target_prob'])}"])
    lines += table(header, rows, "rrrl" + "r" * 6)
    lines += _per_step_table(claims, "Accuracy at every evaluated step (CPLM / baseline / baseline + cache):",
                             lambda c, s: " / ".join(fmt(v, 3) for v in (c["cplm_accuracy"].get(s),
                                                                        c["baseline_accuracy"].get(s),
                                                                        (c.get("baseline_cache_accuracy") or {}).get(s))))
    lines += _per_step_table(claims, "Mean probability of the right symbol at every evaluated step (CPLM / baseline):",
                             lambda c, s: f"{prob(c['cplm_target_prob'].get(s))} / {prob(c['baseline_target_prob'].get(s))}")
    lines += _per_step_table(claims, "The baseline's loss at every evaluated step (ln V beside it in the table above):",
                             lambda c, s: fmt((c.get("baseline_loss") or {}).get(s), 3))
    lines += ["", ("Reading: at every position t >= 1 all copy candidates propose the repeated symbol, so the copy "
              "distribution is a point mass on it and the CPLM's argmax is right from initialization as soon as "
              "g_t > (1 - g_t) max_v p_LM(v) (the gate starts at sigmoid(-2) = 0.12): its (L-1)/L is a ceiling "
              "reached by construction, the one a cache on the untrained baseline reaches too, and the previous-token "
              "copier is right everywhere. Training then raises the gate, i.e. p(target). What SpamLang shows is a "
              "copy mechanism against an LM head that cannot copy: an untied LM head sees each of the V symbols a "
              "few times at most, so its loss stays near ln V unless it learns a per-symbol mapping. A tied LM head "
              "gets the symbol's logit from the input embedding itself (e_v . e_v is the largest dot product), which "
              "is why tied baselines can be accurate while their p(target) stays near 1/V."), ""]
    return lines


# -------------------------------------------------------------------------------------- corpus


def corpus_section(pairs: Sequence[PairSummary]) -> list[str]:
    pairs = [p for p in pairs if p.cplm.spec.experiment == "corpus"]
    if not pairs:
        return []
    lines = ["## Embedded corpus (Python stdlib sources)", "",
             ("Last checkpoint. Train NLL: the trainer's last logged NLL of the output distribution (the mixture for "
              "CPLM, not its whole objective, which adds the LM head's auxiliary cross entropy). Val: the "
             "validation split. Copy: random spans repeated once (accuracy on the repeat). Passkey: mean retrieval "
             "accuracy over the operating points below. Gradient: on a validation batch."), ""]
    header = ["model", "train NLL", "val loss", "val ppl", "copy acc.", "passkey retrieval (token acc.)",
              "logit grad outside LM-head span (chance)", "copy-head share of dL/dh"]
    for pair in pairs:  # one table per pair (the ablation has one corpus pair)
        rows = []
        for run in (pair.baseline, pair.cplm):
            _, losses = run.nll_curve()
            rows.append([NAMES[run.spec.copy_head], fmt(losses[-1] if losses else None, 3),
                         fmt(_metric(run, "val", "val_loss"), 3), fmt(_metric(run, "val", "val_ppl"), 1),
                         fmt(_metric(run, "copy", "copy_accuracy"), 3),
                         f"{fmt(_metric(run, 'passkey', 'passkey_accuracy'), 3)} "
                         f"({fmt(_metric(run, 'passkey', 'passkey_token_accuracy'), 3)})",
                         f"{fmt(_metric(run, 'gradient', 'logit_grad_outside_span'), 5)} "
                         f"({fmt(_metric(run, 'gradient', 'logit_grad_outside_span_chance'), 5)})",
                         fmt(_metric(run, "gradient", "copy_grad_share"), 3)])
        lines += table(header, rows, "l" + "r" * 7)
        lines.append("")
        for run in (pair.baseline, pair.cplm):
            details = run.final["tasks"].get("passkey", {}).get("details")
            if details:
                lines += [(f"Passkey operating points, {NAMES[run.spec.copy_head]}: whole-key retrieval rate "
                          f"(key-token accuracy), {details['samples_per_cell']} samples per cell:"), "",
                          _passkey_markdown(details), ""]
    return lines


def _passkey_markdown(details: dict[str, Any]) -> str:
    depths = details["depths"]
    cell = {(c["length"], c["depth"]): c for c in details["grid"]}
    rows = [[str(L), *(f"{fmt(cell[(L, d)]['accuracy'], 2)} ({fmt(cell[(L, d)]['token_accuracy'], 2)})"
                       for d in depths)] for L in details["lengths"]]
    return "\n".join(table(["context length", *(f"depth {d:g}" for d in depths)], rows, "r" * (len(depths) + 1)))


# -------------------------------------------------------------------------------------- plots


CHANCE = {"color": "gray", "ls": "--", "lw": 0.9}


def _steps_axis(ax) -> None:
    """Training steps are whole numbers."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _line(ax, its: Sequence[int], vals: Sequence[float], *style: str, **kw: Any) -> None:
    """A curve; its points marked where there are too few of them to draw a line."""
    ax.plot(its, vals, *style, **({"marker": ".", **kw} if len(its) < 4 and "marker" not in kw else kw))


def pair_title(pair: PairSummary) -> str:
    """A pair's panel title in words (its group name is a directory name)."""
    label = pair.cplm.spec.label
    if pair.cplm.spec.experiment == "corpus":
        return f"Python stdlib corpus (V={label['vocab']})"
    return f"SpamLang, V={label['vocab']}, {'tied' if label['tied'] else 'untied'} LM head"


def plot_losses(pairs: Sequence[PairSummary], path: Path) -> Path | None:
    """Training NLL of the output distribution (the mixture for CPLM) and validation loss vs step, one panel per
    pair, one colour per model, beside chance (ln V); CPLM's LM-head cross entropy (its auxiliary term) dotted."""
    if not pairs:
        return None
    fig, axes = grid(len(pairs))
    for ax, pair in zip(axes, pairs):
        for run in (pair.baseline, pair.cplm):
            name, color = NAMES[run.spec.copy_head], COLORS[run.spec.copy_head]
            its, vals = run.nll_curve()
            _line(ax, its, vals, color=color, lw=1.2, label=f"{name}: training loss")
            its, vals = run.train_curve("val_loss")
            if its:
                ax.plot(its, vals, "o--", color=color, ms=4, label=f"{name}: validation loss")
            if run.spec.copy_head:
                its, vals = run.train_curve("lm_loss")
                _line(ax, its, vals, ":", color=color, label="CPLM: its LM head alone")
        ax.axhline(math.log(pair.cplm.spec.label["vocab"]), **CHANCE, label="chance: ln V")
        ax.set(title=pair_title(pair), xlabel="training step", ylabel="loss (nats/token)")
        _steps_axis(ax)
        ax.legend(fontsize=7)
    fig.suptitle("Loss of the model's output distribution (the mixture for the CPLM)")
    return save(fig, path)


def plot_accuracy(pairs: Sequence[PairSummary], path: Path) -> Path | None:
    """Copy accuracy (corpus) and SpamLang accuracy vs step, one colour per model, beside chance."""
    panels = [(p, "copy", "copy_accuracy") for p in pairs if p.cplm.spec.experiment == "corpus"]
    panels += [(p, "spamlang", "spamlang_accuracy") for p in pairs if p.cplm.spec.experiment == "spamlang"]
    if not panels:
        return None
    fig, axes = grid(len(panels))
    for ax, (pair, task, metric) in zip(axes, panels):
        for run in (pair.baseline, pair.cplm):
            its, vals = run.eval_curve(task, metric)
            ax.plot(its, vals, "o-", ms=4, color=COLORS[run.spec.copy_head], label=NAMES[run.spec.copy_head])
        if task == "copy":
            chance = _metric(pair.baseline, "copy", "copy_accuracy_chance")
            what = "copy accuracy on a repeated span"
        else:
            chance = 1.0 / pair.cplm.spec.label["vocab"]
            what = "next-symbol accuracy"
            ax.axhline(SPAMLANG_TARGET, color="black", lw=0.8, ls=":", label=f"{SPAMLANG_TARGET:.0%} (the target)")
        if chance is not None:
            ax.axhline(chance, **CHANCE, label=f"chance ({chance:.1e})")
        ax.set(title=f"{pair_title(pair)}:\n{what}", xlabel="training step", ylabel="accuracy", ylim=(-0.03, 1.03))
        _steps_axis(ax)
        ax.legend(fontsize=7)
    return save(fig, path)


def plot_passkey(pairs: Sequence[PairSummary], path: Path) -> Path | None:
    """Passkey operating points of the last checkpoints: per model a heatmap of the loss on the key tokens (nats),
    by context length and needle depth, beside chance (ln V). At tiny scale no model retrieves a key (the report's
    tables: accuracy 0 in every cell); the loss still shows how much probability each model puts on the key."""
    runs = [run for p in pairs for run in (p.baseline, p.cplm) if "passkey" in run.final["tasks"]]
    if not runs or any("loss" not in run.final["tasks"]["passkey"]["details"]["grid"][0] for run in runs):
        return None
    grids = {id(run): run.final["tasks"]["passkey"]["details"] for run in runs}
    cells = {id(run): {(c["length"], c["depth"]): c["loss"] for c in grids[id(run)]["grid"]} for run in runs}
    top = max(max(v.values()) for v in cells.values())
    fig, axes = grid(len(runs), cols=2)
    for ax, run in zip(axes, runs):
        details = grids[id(run)]
        rows = [[cells[id(run)][(L, d)] for d in details["depths"]] for L in details["lengths"]]
        image = ax.imshow(rows, vmin=0, vmax=top, cmap="viridis_r", aspect="auto", origin="lower")
        ax.set_xticks(range(len(details["depths"])), [f"{d:g}" for d in details["depths"]])
        ax.set_yticks(range(len(details["lengths"])), [str(L) for L in details["lengths"]])
        for i, row in enumerate(rows):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="k" if value < top / 2 else "w",
                        fontsize=9)
        vocab = run.spec.label.get("vocab")
        ax.set(title=f"{NAMES[run.spec.copy_head]}" + (f" (chance: ln V = {math.log(vocab):.2f})" if vocab else ""),
               xlabel="needle depth (0: start, 1: end)", ylabel="context length (tokens)")
        fig.colorbar(image, ax=ax, label="loss on the key tokens (nats)")
    fig.suptitle(f"Passkey at the last checkpoint: loss on the key tokens, {details['samples_per_cell']} samples per "
                 "cell\n(lower: more probability on the key; retrieval rates: the report's tables)")
    return save(fig, path)


def gradient_in_span(run: RunResults) -> tuple[list[int], list[float]]:
    """(iterations, share of the logit gradient inside the LM head's column span, ||P G|| / ||G||): the complement of
    the table's outside share, sqrt(1 - outside^2)."""
    its, vals = [], []
    for entry in run.checkpoints:
        metrics = entry["tasks"].get("gradient", {}).get("metrics", {})
        outside = metrics.get("logit_grad_outside_span")
        inside = metrics.get("logit_grad_inside_span", None if outside is None else math.sqrt(1 - outside**2))
        if inside is not None:
            its.append(entry["iteration"])
            vals.append(inside)
    return its, vals


def plot_gradients(pairs: Sequence[PairSummary], path: Path) -> Path | None:
    """Per pair: the share of the LM head's logit gradient inside its column span (the complement of the table's
    outside share, which sits within 1e-3 of 1 and reads as noise) beside its chance value sqrt(d/V), and the copy
    head's share of dL/dh, vs step; one colour per model."""
    pairs = [p for p in pairs if "gradient" in p.cplm.final["tasks"]]
    if not pairs:
        return None
    panels = [(p, "inside") for p in pairs] + [(p, "share") for p in pairs]
    fig, axes = grid(len(panels), cols=min(3, len(pairs)))
    for ax, (pair, kind) in zip(axes, panels):
        if kind == "inside":
            for run in (pair.baseline, pair.cplm):
                its, vals = gradient_in_span(run)
                ax.plot(its, vals, "o-", ms=3, color=COLORS[run.spec.copy_head], label=NAMES[run.spec.copy_head])
            outside_chance = _metric(pair.baseline, "gradient", "logit_grad_outside_span_chance")
            if outside_chance is not None:
                chance = math.sqrt(1 - outside_chance**2)
                ax.axhline(chance, **CHANCE, label=f"chance sqrt(d/V) = {chance:.4f}")
            ax.set(title=f"{pair_title(pair)}:\nlogit gradient inside the LM head's span\n"
                         "(the table's outside share is sqrt(1 - this²))",
                   xlabel="training step", ylabel="||P G|| / ||G||")
            ax.yaxis.set_major_formatter("{x:.4f}")
        else:
            its, vals = pair.cplm.eval_curve("gradient", "copy_grad_share")
            ax.plot(its, vals, "o-", ms=3, color=COLORS[True], label="CPLM")
            ax.set(title=f"{pair_title(pair)}:\ncopy head's share of dL/dh", xlabel="training step",
                   ylabel="||g_copy|| / (||g_lm|| + ||g_copy||)", ylim=(0, 1))
        _steps_axis(ax)
        ax.legend(fontsize=7)
    return save(fig, path)


# -------------------------------------------------------------------------------------- report


def recorded_runtimes(output: Path, runs: Sequence[RunResults]) -> dict[str, tuple[float, float]]:
    """{run: (train s, eval s)} from each run's timing.json (every attempt; a reused run keeps its own time)."""
    out = {}
    for run in runs:
        timing = read_timing(Path(output) / "runs" / run.spec.name / "timing.json")
        if timing is not None:
            out[run.spec.name] = (timing["train_seconds"], timing["eval_seconds"])
    return out


def write_report(output: Path, runs: Sequence[RunResults], meta: dict[str, Any]) -> Path:
    """Write `output/report.md` and its plots; returns the report path.

    meta: {'command': str, 'settings': dict, 'seconds': float, 'runtimes': {run name: (train s, eval s)}}.
    """
    output.mkdir(parents=True, exist_ok=True)
    pairs = pair_up(runs)
    plots = {
        "Loss curves": plot_losses(pairs, output / "loss_curves.png"),
        "Copy and SpamLang accuracy vs steps": plot_accuracy(pairs, output / "copy_accuracy.png"),
        "Passkey: loss on the key tokens (last checkpoint)": plot_passkey(pairs, output / "passkey.png"),
        "Gradient retention": plot_gradients(pairs, output / "gradient_retention.png"),
    }
    runtimes = recorded_runtimes(output, runs) or meta.get("runtimes", {})
    recorded = sum(t + e for t, e in runtimes.values())
    lines = ["# CPLM vs baseline ablation (tiny scale, CPU)", "",
             f"Command: `{meta.get('command', '')}`; the runs' recorded time {recorded:.0f} s (training + evaluation, "
             f"every attempt; reused runs keep their own); this invocation {meta.get('seconds', 0):.0f} s.", "",
             "Each pair trains a baseline and a CPLM with identical settings (recipe, seed, data order, steps); "
             "only `copy_head.enabled` differs. Settings: "
             + ", ".join(f"{k}={v}" for k, v in meta.get("settings", {}).items()) + ".", ""]
    lines += spamlang_section(pairs)
    lines += corpus_section(pairs)
    lines += ["## Plots", ""]
    for title, path in plots.items():
        lines += [f"### {title}", "", f"![{title}]({path.name})" if path else "(no data for this plot)", ""]
    if runtimes:
        lines += ["## Runs", "", *table(["run", "train s", "eval s"],
                                        [[name, f"{t:.0f}", f"{e:.0f}"] for name, (t, e) in runtimes.items()], "lrr")]
        lines.append("")
    report = output / "report.md"
    report.write_text("\n".join(lines))
    return report
