"""Every results figure README.md and docs/ quote is its committed record's: a registry with one entry per quoted
passage (the page, the passage with format fields where its figures go, the records under results/ it comes from,
a function computing the figures from them) asserts the page holds exactly the passage recomputed; the GPU tables
are benchmarks/gpu/results_table.py's output, between their markers; in the sections listed in COVERED every
token with a digit is a registered figure or named in NOT_FIGURES (a setting, a name, a citation), so a figure
added there without an entry fails. Reading JSON only: no training.

To tie a new figure: add a Quote (the passage as the page words it, `{}` or `{:.3f}` where a figure goes, the
record paths, a function of the loaded records returning the figures in order)."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest

from benchmarks.gpu import results_table as gpu

REPO = Path(__file__).resolve().parents[1]

GPU = "results/gpu/2026-12-04"
STUDY = "results/study_cpu_v3/summary.json"
STUDY_RUNS = "results/study_cpu_v3/runs"
ABLATION = "results/ablation_cpu"
EMERGENCE = "results/emergence_cpu/summary.json"
H64, H128 = (f"results/study_cpu_v3/spamlang_h{h}/results.json" for h in (64, 128))


@dataclass(frozen=True)
class Quote:
    """A passage of `page` whose format fields are `value(*records)` (one value, or a tuple in order)."""

    page: str
    text: str
    records: tuple[str, ...]
    value: Callable[..., Any]

    def render(self) -> str:
        """The passage with the figures computed from the records, whitespace collapsed."""
        values = self.value(*(record(path) for path in self.records))
        return normalized(self.text.format(*(values if isinstance(values, tuple) else (values,))))


def normalized(text: str) -> str:
    return " ".join(text.split())


def sci(x: float, digits: int = 1) -> str:
    """Scientific notation as the docs write it: 2.4e-4 (Python's 2.4e-04 without the exponent's zero)."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


@lru_cache(maxsize=None)
def record(path: str) -> Any:
    """A record by its path in the checkout: JSON, JSON lines (a list), or a folder (its Path)."""
    full = REPO / path
    if full.is_dir():
        return full
    if full.suffix == ".jsonl":
        return [json.loads(line) for line in full.read_text().splitlines() if line.strip()]
    return json.loads(full.read_text())


@lru_cache(maxsize=None)
def page(name: str) -> str:
    return normalized((REPO / name).read_text())


# --- figures from the GPU check (results/gpu/<date>/) -------------------------------------------------------------

@lru_cache(maxsize=None)
def gpu_runs(results: Path) -> dict:
    return gpu.training_runs(results)


def overheads_1p7b(results: Path) -> tuple:
    """The copy head's step-time cost at 1.7B, least and most, in %."""
    runs = gpu_runs(results)
    costs = [gpu.overhead(runs, name) for name in ("1p7b_4k_cplm_g4", "1p7b_4k_cplm_g16", "1p7b_cplm_chunked")]
    return 100 * min(costs), 100 * max(costs)


def planner_ratios(results: Path) -> tuple:
    """Peak over the current planner's estimate: the worst deviation in whole % (rounded up), least, most, runs."""
    ratios = [run.peak_gib / run.estimate_gib for run in gpu_runs(results).values()]
    return math.ceil(100 * max(abs(r - 1) for r in ratios)), min(ratios), max(ratios), len(ratios)


def recorded_ratios(summary: dict) -> tuple:
    """Peak over the estimate the check recorded, least and most."""
    ratios = [run["peak_over_estimate"] for slot in summary["training"].values() for run in slot.values()
              if isinstance(run, dict)]
    return min(ratios), max(ratios)


def kernel_vs_flash(summary: dict) -> tuple:
    """The fused copy-score kernel over SDPA flash: least and most, and the lengths (k) it was timed at."""
    rows = summary["copy_kernel"].values()
    ratios, lengths = [r["fused_over_sdpa_flash"] for r in rows], [r["seq_len"] for r in rows]
    return min(ratios), max(ratios), min(lengths) // 1024, max(lengths) // 1024


def kernel_times(summary: dict) -> tuple:
    rows = sorted(summary["copy_kernel"].values(), key=lambda r: r["seq_len"])
    fused, flash = (r["fused_fwd_bwd_ms"] for r in rows), (r["sdpa_flash_fwd_bwd_ms"] for r in rows)
    speed = [r["fp8_fwd_speedup"] for r in rows]
    return (*(f"{t:.3g}" for t in fused), *(f"{t:.2f}" for t in flash),
            *(f"{r['fused_over_sdpa_flash']:.1f}" for r in rows), min(speed), max(speed),
            rows[-1]["fused_extra_mem_pct_of_naive"])


def kernel_errors(summary: dict) -> tuple:
    """The kernel check's length and head widths, and its largest logsumexp error (bf16 and fp32 together, then
    FP8) over its cases, all passed."""
    cases = summary["kernel_check"]["cases"]
    assert all(c["ok"] for c in cases)
    worst = {kind: max(max(c["errors"]["lse_all"], c["errors"]["lse_match"]) for c in cases if c["kind"] in kinds)
             for kind, kinds in (("bf16/fp32", ("bf16", "fp32")), ("fp8", ("fp8",)))}
    widths = sorted({c["d"] for c in cases})
    return summary["kernel_check"]["T"], *widths, sci(worst["bf16/fp32"]), sci(worst["fp8"])


def lm_head_rows(rerun: dict) -> tuple:
    """The LM-head loss times (ms) by hidden/seq and path, and the working memory (MiB) at 576/2048."""
    rows = {(r["hidden"], r["seq"], r["impl"]): r for r in rerun["lm_head_loss"]["rows"]}
    order = ("megatron", "chunked", "fused")
    times = [f"{1e3 * rows[(h, s, i)]['time_s']:.1f}" for h, s in ((576, 2048), (576, 8192), (2048, 2048))
             for i in order]
    memory = [f"{rows[(576, 2048, i)]['working_bytes'] / 2**20:.0f}" for i in order]
    return (*times, *memory)


def profile_135m(profile: dict) -> tuple:
    """Kernel launches per step (both launch calls), each call's count per step, the matmul share of GPU time."""
    ops = {op["name"]: op for op in profile["top_cpu_ops"]}
    kernels = {k["name"]: k for k in profile["top_kernels"]}
    steps = profile["active_steps"]
    runtime, driver = ops["cudaLaunchKernel"]["count"] / steps, ops["cuLaunchKernelEx"]["count"] / steps
    share = kernels["aten::mm"]["us"] / kernels["ProfilerStep*"]["us"]
    return f"{round(runtime + driver, -3):,.0f}", f"{runtime:,.0f}", f"{driver:,.0f}", f"{100 * share:.0f}"


def profile_1p7b(profile: dict) -> tuple:
    step_ms = {k["name"]: k["us"] / profile["active_steps"] / 1e3 for k in profile["top_kernels"]}
    return step_ms["Optimizer.step#AdamW.step"], 1e3 * profile["step_s"]


def performance_table(results: Path) -> tuple:
    runs, peer = gpu_runs(results), gpu.peer_runs(results)
    cells = []
    for name in ("135m_base_megatron", "135m_base_chunked", "1p7b_4k_base_g16"):
        run = runs[name]
        cells += [gpu.k(run.tokens_per_sec), gpu.pct(run.mfu_full), gpu.pct(run.mfu_causal), run.peak_gib]
    cplm = runs["1p7b_4k_cplm_g16"]
    cells += [gpu.k(cplm.tokens_per_sec), gpu.pct(gpu.overhead(runs, "1p7b_4k_cplm_g16"), True), cplm.peak_gib]
    eager, compiled = peer["smollm2-135m"], peer["smollm2-135m+compile"]
    return (*cells, gpu.k(eager["tokens_per_s"]), gpu.k(compiled["tokens_per_s"]), eager["peak_memory_gib"],
            compiled["peak_memory_gib"])


def versus_peer_135m(results: Path) -> tuple:
    """Our 135M tokens/s over the peer's, eager and compiled."""
    ours, peer = gpu_runs(results)["135m_base_megatron"].tokens_per_sec, gpu.peer_runs(results)
    return ours / peer["smollm2-135m"]["tokens_per_s"], ours / peer["smollm2-135m+compile"]["tokens_per_s"]


def chunked_cost(rerun: dict, summary: dict) -> tuple:
    """The LM-head loss paths at 576/2048 (ms), the 135M step's chunked slowdown, and the chunked loss's extra time
    at 1.7B (two sequences of 2048 at hidden 2048) as a share of the 1.7B seq-2048 step."""
    times = lm_head_rows(rerun)
    megatron, chunked = (float(times[i]) for i in (6, 7))
    step = summary["training"]["large"]["base_chunked"]["step_time"]
    micro = summary["training"]["large"]["base_chunked"]["micro_batch"]
    share = micro * (chunked - megatron) / 1e3 / step
    return (times[0], times[2], times[1], summary["training"]["small"]["base_chunked_over_megatron_loss_step_time"],
            times[7], times[6], 100 * share, 1e3 * step)


def planner_examples(results: Path) -> tuple:
    """The current planner's error (estimate over peak, less 1, in %: least, most, runs) and four runs' figures."""
    runs = gpu_runs(results)
    errors = [100 * (run.estimate_gib / run.peak_gib - 1) for run in runs.values()]
    pairs = [(runs[n].estimate_gib, runs[n].peak_gib) for n in ("135m_base_megatron", "135m_base_chunked",
                                                               "1p7b_base_chunked", "1p7b_4k_base_g16")]
    return (min(errors), max(errors), len(errors), *(v for pair in pairs for v in pair))


# --- figures from the CPU benchmarks (results/*_cpu.json, results/long_context/) --------------------------------

def overhead_rows(bench: dict) -> tuple:
    """The copy-head overhead table's number cells, row by row."""
    return tuple(cell for r in bench["rows"] for cell in (
        r["seq_len"], f"{r['baseline_step_s']:.3f}", f"{r['cplm_step_s']:.3f}", f"{r['time_ratio']:.2f}",
        f"{r['baseline_peak_mem_mib']:.1f}", f"{r['cplm_peak_mem_mib']:.1f}", f"{r['memory_ratio']:.2f}"))


def mib(n: float) -> str:
    """Bytes as the kernel table prints them: MiB below 1 GiB (no decimals), else GiB with one."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def copy_kernel_rows(bench: dict) -> tuple:
    """The CPU copy-kernel table's rows (T, d_c, naive and chunked fwd+bwd time and extra memory, their ratios)."""
    rows = {(r["impl"], r["T"], r["d"], r["mode"]): r for r in bench["rows"]}
    cells = []
    for t, d in ((1024, 64), (4096, 64), (4096, 128)):
        naive, chunked = rows["naive", t, d, "fwd+bwd"], rows["chunked", t, d, "fwd+bwd"]
        memory = chunked["extra_mem_bytes"] / naive["extra_mem_bytes"]
        cells += [t, d, f"{naive['time_ms']:.0f}", f"{chunked['time_ms']:.0f}",
                  f"{chunked['time_ms'] / naive['time_ms']:.2f}", mib(naive["extra_mem_bytes"]),
                  mib(chunked["extra_mem_bytes"]), f"{memory:.2g}" if memory < 0.1 else f"{memory:.2f}"]
    fused = next(r for r in bench["rows"] if r["impl"].startswith("fused") and r["T"] == 64 and r["mode"] == "fwd")
    return (*cells, fused["extra_mem_bytes"] / 1024)


def lm_head_cpu_rows(bench: dict) -> tuple:
    rows = {(r["impl"], r["hidden"], r["seq"]): r for r in bench["rows"]}
    cells = []
    for hidden, seq in ((576, 2048), (576, 8192), (2048, 2048), (2048, 8192)):
        megatron, chunked = rows["megatron", hidden, seq], rows["chunked", hidden, seq]
        ratios = bench["ratios"][f"chunked[h={hidden},seq={seq},V=49152,float32]"]
        cells += [hidden, seq, f"{megatron['time_s']:.2f}", f"{megatron['working_bytes'] / 2**20:.0f}",
                  f"{chunked['time_s']:.2f}", f"{chunked['working_bytes'] / 2**20:.1f}",
                  f"{100 * ratios['memory_ratio']:.2f}", f"{ratios['time_ratio']:.2f}"]
    return tuple(cells)


def long_context_table(bench: dict) -> tuple:
    """The long-context table: per length (the short phase's, then the 8k phase's) each row's cells."""
    def by_length(arm: str) -> list:
        run = bench["runs"][arm]
        return run["phases"][0]["by_length"] + run["by_length"]

    cplm, base = by_length("cplm"), by_length("baseline")
    samples = [3 * r["passkey_samples_per_depth"] for r in cplm]
    rows = [[str(r["length"]) for r in cplm],
            [f"{r['copy_accuracy']:.3f}" for r in cplm], [f"{r['copy_accuracy_one_token_match']:.3f}" for r in cplm],
            [f"{r['copy_accuracy']:.3f}" for r in base],
            [f"{round(r['passkey_first_token_accuracy'] * n)}/{n}" for r, n in zip(cplm, samples)],
            [f"{round(r['passkey_first_token_accuracy'] * n)}/{n}" for r, n in zip(base, samples)],
            [f"{r['copy_mean_gate']:.2f}" for r in cplm]]
    chance = bench["runs"]["cplm"]["chance"]
    return (*(" | ".join(row) for row in rows), f"{chance['copy_accuracy']:.4f}",
            f"{chance['passkey_first_token_accuracy']:.4f}", round(1 / chance["passkey_first_token_accuracy"]))


def long_context_prose(bench: dict) -> tuple:
    """The losses against ln V, the copy scores quoted by length, the passkey counts, the cost."""
    runs, vocab = bench["runs"], bench["settings"]["vocab"]
    rows = {arm: {r["length"]: r for r in runs[arm]["phases"][0]["by_length"] + runs[arm]["by_length"]}
            for arm in runs}
    c = rows["cplm"]

    def pair(length: int) -> str:
        return f"{c[length]['copy_accuracy']:.3f} vs {c[length]['copy_accuracy_one_token_match']:.3f}"

    def found(length: int) -> int:
        return round(c[length]["passkey_first_token_accuracy"] * 3 * c[length]["passkey_samples_per_depth"])

    base, cplm = runs["baseline"], runs["cplm"]
    assert found(4096) == found(8192) and found(32768) == 0
    return (vocab, math.log(vocab), base["phases"][0]["final_loss"], base["final_loss"], pair(256), pair(512),
            pair(4096), pair(8192), pair(16384), pair(32768), found(4096), found(16384),
            round(base["phases"][0]["train_seconds"]), round(base["train_seconds"]),
            round(cplm["phases"][0]["train_seconds"]), round(cplm["train_seconds"]), round(base["eval_seconds"]),
            round(cplm["eval_seconds"]), round(c[32768]["seconds"]))


def copy_task_run(bench: dict) -> tuple:
    run = bench["runs"]["cplm"]
    by = {r["length"]: r["copy_accuracy"] for r in run["phases"][0]["by_length"]}
    return run["phases"][0]["iterations"], by[256], by[128], by[512]


def data_prep(bench: dict) -> tuple:
    """The data-preparation throughput: the corpus, each stage's tokens per core-second, core-hours per 100B tokens
    (the median and the repetitions' range), and what that is on 64-core nodes."""
    st, env = bench["stages"], bench["environment"]
    tokens = st["read"]["tokens"]
    mb = st["read"]["mb_per_core_s"] * st["read"]["cpu_s_median"]
    hours = [1e11 * s / tokens / 3600 for s in st["prepare"]["cpu_s_all"]]
    per_100b = st["prepare"]["core_hours_per_100b_tokens"]
    return (env["files"], mb, tokens / 1e6, st["tokenize"]["tokens_per_core_s"] / 1e3,
            f"{st['write']['tokens_per_core_s'] / 1e3:,.0f}",
            math.floor(min(st["read"]["tokens_per_core_s"], st["read_jsonl_zst"]["tokens_per_core_s"]) / 1e6 + 0.5),
            st["prepare"]["tokens_per_core_s"] / 1e3, per_100b, min(hours), max(hours), env["reps"], per_100b / 64,
            60 * per_100b / 64 / 16, st["write"]["tokens_per_core_s"] / st["tokenize"]["tokens_per_core_s"])


def checksum_rows(bench: dict) -> tuple:
    """The checksums' cost table: per preset, the size and each timing's range over the repetitions (tiny's short
    ones in ms) with the checksums' and the check's share of the median save and load."""
    tiny, small = bench["results"]

    def spread(result: dict, key: str, unit: str, digits: int) -> str:
        values = [r[key] * (1e3 if unit == "ms" else 1) for r in result["repeats"]]
        return f"{min(values):.{digits}f}-{max(values):.{digits}f} {unit}"

    return (tiny["parameters"] / 1e6, tiny["bytes"] / 1e6, spread(tiny, "save_s", "s", 2),
            spread(tiny, "checksum_s", "ms", 0), 100 * tiny["checksum_share_of_save"], spread(tiny, "load_s", "s", 2),
            spread(tiny, "verify_s", "ms", 0), 100 * tiny["verify_share_of_load"], small["bytes"] / 1e9,
            spread(small, "save_s", "s", 0), spread(small, "checksum_s", "s", 1), 100 * small["checksum_share_of_save"],
            spread(small, "load_s", "s", 1), spread(small, "verify_s", "s", 1), 100 * small["verify_share_of_load"])


def code_corpus(build: dict) -> tuple:
    sp, overlap = build["splits"], build["held_out_overlap"]["val"]
    return (len(build["distributions"]), sum(d["bytes"] for d in build["distributions"]) / 1e6, build["wall_seconds"],
            sp["train"]["tokens"] / 1e6, f"{sp['val']['documents']:,}", sp["val"]["tokens"] / 1e6,
            100 * sp["val"]["largest_document_share"], sp["dev"]["documents"], sp["dev"]["tokens"] / 1e6,
            100 * overlap["fraction_in_train"])


# --- figures from the CPU recipe study (results/study_cpu_v3/) ----------------------------------------------------

def interval(d: dict) -> str:
    """A paired difference as the docs print it: '-0.641 [-0.671, -0.611]'."""
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def wins(d: dict) -> int:
    return sum(v < 0 for v in d["per_seed"].values())


def scale_label(s: dict, scale: str) -> tuple:
    model = s["scales"][scale]["model"]
    return model["hidden"], model["layers"], len(s["scales"][scale]["seeds"])


def cache_share(s: dict) -> tuple:
    """The cache control's gain over the baseline as a share of aux1's, tiny and small."""
    return tuple(s["scales"][sc]["cache_control"]["paired_vs_baseline"]["val_loss"]["mean"]
                 / s["scales"][sc]["vs_baseline"]["aux1"]["mean"] for sc in ("tiny", "small"))


def baseline_copying(s: dict, runs: Path) -> tuple:
    """How many baselines copy at 0.000; the one that does not: its accuracy, scale, seed, tokens right of scored."""
    per_run = [(scale, seed, v["copy_accuracy"]) for scale in ("tiny", "small")
               for seed, v in s["scales"][scale]["arms"]["baseline"]["per_seed"].items()]
    zero = [r for r in per_run if round(r[2], 3) == 0]
    [(scale, seed, accuracy)] = [r for r in per_run if round(r[2], 3) != 0]
    scored = json.loads((runs / f"{scale}-baseline-s{seed}" / "eval.json").read_text())["tasks"]["copy"]
    scored = scored["details"]["scored_tokens"]
    return len(zero), len(per_run), accuracy, scale, seed, round(accuracy * scored), f"{scored:,}"


def readme_row(s: dict, scale: str) -> tuple:
    """The README's short table row of a scale: the study table's baseline, control and aux1 cells."""
    from cplm_megatron.experiments.study.report import readme_block

    rows = {(r[0].split(" (")[0], r[1]): r for r in
            ([c.strip() for c in line.strip().strip("|").split(" | ")] for line in readme_block(s).splitlines()[3:-1])}
    base, cache, aux1 = (rows[(scale, a)] for a in ("baseline", "baseline+cache (control)", "aux1 **(default)**"))
    return (*scale_label(s, scale), base[2], cache[2], aux1[2], aux1[3], aux1[4])


def passkey_counts(s: dict) -> tuple:
    """First-key-token retrievals summed over seeds (count, samples) per (scale, arm), with rates and x chance."""
    per_seed = len(s["settings"]["passkey_lengths"]) * len(s["settings"]["passkey_depths"]) * \
        s["settings"]["eval_sequences"]

    def count(scale: str, arm: str) -> tuple:
        seeds = s["scales"][scale]["arms"][arm]["per_seed"].values()
        return round(sum(v["passkey_first_token_accuracy"] for v in seeds) * per_seed), per_seed * len(seeds)

    chance = s["scales"]["tiny"]["arms"]["baseline"]["per_seed"]["1"]["passkey_first_token_chance"]
    counts = {(sc, arm): count(sc, arm) for sc in ("tiny", "small") for arm in ("baseline", "aux1", "sentinel+aux1")}
    counts["tiny", "mixture"] = count("tiny", "mixture")
    assert counts["tiny", "baseline"] == counts["tiny", "aux1"] and counts["small", "baseline"] == counts["small", "aux1"]
    lows = [n / total / chance for n, total in (counts["tiny", "aux1"], counts["small", "aux1"])]
    sent_t, sent_s, mix = counts["tiny", "sentinel+aux1"], counts["small", "sentinel+aux1"], counts["tiny", "mixture"]
    return (sci(chance), *counts["tiny", "aux1"], *counts["small", "aux1"], math.floor(min(lows)),
            math.ceil(max(lows)), sent_t[0], f"{sent_t[1]:,}", sent_s[0], f"{sent_s[1]:,}", sent_t[0] / sent_t[1],
            sent_s[0] / sent_s[1], mix[0], f"{mix[1]:,}", mix[0] / mix[1], mix[0] / mix[1] / chance)


def copy_means(s: dict) -> tuple:
    acc = {(sc, arm): a["mean_std"]["copy_accuracy"]["mean"] for sc in ("tiny", "small")
           for arm, a in s["scales"][sc]["arms"].items()}
    controls = s["scales"]["tiny"]["copy_controls"]
    return (acc["tiny", "aux1"], acc["small", "aux1"], acc["tiny", "sentinel+aux1"], acc["small", "sentinel+aux1"],
            acc["tiny", "mixture"], sci(controls['copy_accuracy_chance']),
            max(acc["tiny", "baseline"], acc["small", "baseline"], 0.001), controls["copy_accuracy_one_token_match"])


def spamlang_600(s: dict) -> tuple:
    """The 600-step SpamLang run of summary.json: accuracy, p(target), the copiers, the baseline's loss and p."""
    [run] = s["spamlang"]
    assert set(run["cplm_accuracy"].values()) == {run["cplm_accuracy"]["0"]}
    assert set(run["baseline_cache_accuracy"].values()) == {run["baseline_cache_accuracy"]["0"]}
    assert set(run["baseline_accuracy"].values()) == {0.0}
    return (f"{run['vocab']:,}", run["hidden"], run["seed"], run["iters"], run["cplm_accuracy"]["0"],
            run["cplm_final_target_prob"], run["iters"], run["previous_token_accuracy"],
            run["baseline_cache_accuracy"]["0"], run["baseline_final_loss"], run["ln_vocab"],
            sci(run['baseline_final_target_prob']), sci(1 / run['vocab']), run["iters"])


def spamlang_60(h64: dict, h128: dict) -> tuple:
    runs = [r["spamlang"][0] for r in (h64, h128)]
    assert all(r["cplm_steps_to_99"] == 0 and r["baseline_steps_to_99"] is None for r in runs)
    p = {round(r["cplm_final_target_prob"], 2) for r in runs}
    assert len(p) == 1
    return (runs[0]["iters"], p.pop(), runs[0]["iters"], *(sci(r["baseline_final_target_prob"]) for r in runs))


def gradient_share(h64: dict, h128: dict) -> tuple:
    """The LM head's logit gradient outside its column span, the baseline's at hidden 64 and 128, at its chance."""
    grads = [r["runs"]["spamlang-v131072-untied-baseline"]["evaluations"][-1]["tasks"]["gradient"]["metrics"]
             for r in (h64, h128)]
    assert all(abs(g["logit_grad_outside_span"] - g["logit_grad_outside_span_chance"]) < 1e-4 for g in grads)
    return tuple(g["logit_grad_outside_span"] for g in grads)


def study_cost(runs: Path, s: dict) -> tuple:
    """Train and evaluation seconds (least, most) by scale from each run's timing.json, tokens/s, the grid's total."""
    timing = {p.parent.name: json.loads(p.read_text()) for p in runs.glob("*/timing.json")}

    def span(scale: str, key: str) -> tuple:
        values = [t[key] for name, t in timing.items() if name.startswith(scale + "-")]
        return min(values), max(values)

    tokens = s["scales"]["tiny"]["tokens"]
    tiny_train, small_train = span("tiny", "train_seconds"), span("small", "train_seconds")
    total = s["run_seconds_total"]
    assert len(timing) == s["runs_with_timing"]
    return (*(f"{round(v):,}" for v in tiny_train), f"{round(tokens / tiny_train[1], -2):,.0f}",
            f"{round(tokens / tiny_train[0], -2):,.0f}", *(round(v) for v in span("tiny", "eval_seconds")),
            *(f"{round(v):,}" for v in small_train), *(round(v) for v in span("small", "eval_seconds")),
            f"{round(total):,}", total / 3600)


def grid_counts(s: dict) -> tuple:
    d, st = s["decision"], s["settings"]
    return (d["planned_runs"] - d["planned_runs_missing"], d["planned_runs"], len(s["scales"]["tiny"]["seeds"]),
            len(st["arms"]), len(st["scale_seeds"]["small"]), len(st["scale_arms"]["small"]))


def tiny_results(s: dict) -> tuple:
    t = s["scales"]["tiny"]
    vb, vc, between = t["vs_baseline"], t["vs_cache"], t["between_arms"]["sentinel+aux1 - aux1"]
    assert all(wins(vb[arm]) == len(t["seeds"]) for arm in vb)
    return (t["arms"]["baseline"]["mean_std"]["val_loss"]["mean"], t["cache_control"]["mean_std"]["val_loss"]["mean"],
            interval(vb["aux1"]), interval(vb["sentinel+aux1"]), interval(vb["mixture"]), wins(vc["aux1"]),
            len(t["seeds"]), interval(vc["aux1"]), interval(vc["sentinel+aux1"]),
            len(t["seeds"]) - wins(vc["mixture"]), len(t["seeds"]), interval(vc["mixture"]), interval(between),
            wins(between), len(t["seeds"]))


def small_results(s: dict) -> tuple:
    sm, t = s["scales"]["small"], s["scales"]["tiny"]
    vb, vc, between = sm["vs_baseline"], sm["vs_cache"], sm["between_arms"]["sentinel+aux1 - aux1"]
    flops = [next(iter(x["arms"]["baseline"]["per_seed"].values()))["train_flops_per_token"] for x in (sm, t)]
    assert wins(vb["aux1"]) == wins(vc["aux1"]) == len(sm["seeds"])
    lm = {arm: sm["arms"][arm]["mean_std"]["lm_val_loss"]["mean"] for arm in ("sentinel+aux1", "baseline", "aux1")}
    return (flops[0] / flops[1], sm["arms"]["baseline"]["mean_std"]["val_loss"]["mean"],
            sm["cache_control"]["mean_std"]["val_loss"]["mean"], interval(vb["aux1"]), interval(vc["aux1"]),
            len(sm["seeds"]), len(sm["seeds"]), interval(vb["sentinel+aux1"]), interval(vc["sentinel+aux1"]),
            vc["sentinel+aux1"]["per_seed"]["1"], interval(between), lm["sentinel+aux1"], lm["baseline"], lm["aux1"])


def v2_retirements(runs: Path) -> tuple:
    """The v2 study's seed 1 against its cache control: aux1+copy, aux1, sentinel (nats)."""
    def val(name: str, task: str = "val", key: str = "val_loss") -> float:
        return json.loads((runs / name / "eval.json").read_text())["tasks"][task]["metrics"][key]

    cache = val("tiny-baseline-s1", "cache", "cache_val_loss")
    return tuple(val(f"tiny-{arm}-s1") - cache for arm in ("aux1+copy", "aux1", "sentinel"))


# --- figures from the first ablation (results/ablation_cpu/) ------------------------------------------------------

def ablation_runs(root: Path) -> dict:
    """The corpus comparison's three seeds: pure mixture (the folder and corpus_seed*) and aux1 (corpus_auxlm*)."""
    load = {name: json.loads((root / name / "results.json").read_text())
            for name in (".", "corpus_seed1", "corpus_seed2", "corpus_auxlm", "corpus_auxlm_seed1", "corpus_auxlm_seed2")}
    return {"mixture": [load[n] for n in (".", "corpus_seed1", "corpus_seed2")],
            "aux1": [load[n] for n in ("corpus_auxlm", "corpus_auxlm_seed1", "corpus_auxlm_seed2")]}


def final_val(results: dict, run: str) -> float:
    return results["runs"][run]["evaluations"][-1]["tasks"]["val"]["metrics"]["val_loss"]


def corpus_comparison(root: Path) -> tuple:
    runs = ablation_runs(root)
    gates = [sum(g) / len(g) for g in ([m["gate_mean"] for m in r["runs"]["corpus-cplm"]["metrics"]
                                        if "gate_mean" in m and m["iteration"] >= 50] for r in runs["mixture"])]
    lm = {arm: [[m for m in r["runs"][arm]["metrics"] if m.get("iteration") == 600 and "val_lm_loss" in m][0]
                ["val_lm_loss"] for r in runs["mixture"]] for arm in ("corpus-cplm", "corpus-baseline")}
    mixture = [final_val(r, "corpus-cplm") for r in runs["mixture"]]
    base = [final_val(r, "corpus-baseline") for r in runs["mixture"]]
    aux_gain = [final_val(m, "corpus-baseline") - final_val(a, "corpus-cplm")
                for m, a in zip(runs["mixture"], runs["aux1"])]
    assert min(aux_gain) > 0
    return (min(gates), max(gates), min(lm["corpus-cplm"]), max(lm["corpus-cplm"]), min(lm["corpus-baseline"]),
            max(lm["corpus-baseline"]), sum(m > b for m, b in zip(mixture, base)), len(mixture),
            "/".join(f"{v:.2f}" for v in mixture), "/".join(f"{v:.2f}" for v in base), min(aux_gain), max(aux_gain))


def spamlang_ablation(results: dict) -> tuple:
    """The 60-step SpamLang table's cells: untied and tied, CPLM and baseline."""
    runs = {(r["vocab"], r["tied"]): r for r in results["spamlang"]}
    untied, tied = [runs[v, False] for v in (4096, 8192, 16384)], [runs[v, True] for v in (4096, 8192, 16384)]
    assert all(r["cplm_steps_to_99"] == 0 and round(r["cplm_accuracy"]["60"], 3) == 0.992 for r in untied + tied)
    assert all(r["baseline_steps_to_99"] is None and r["baseline_accuracy"]["60"] == 0 for r in untied)
    assert all(r["baseline_steps_to_99"] == 0 for r in tied)
    p = [r["baseline_final_target_prob"] for r in untied]
    acc = [r["baseline_accuracy"]["60"] for r in tied]
    start = [r["cplm_target_prob"]["0"] for r in untied + tied]
    return (span([r["cplm_final_target_prob"] for r in untied]), sci(min(p), 0), sci(max(p)),
            span([r["cplm_final_target_prob"] for r in tied]), min(acc), max(acc), min(start), max(start),
            round(results["meta"]["seconds"]))


def span(values: list, digits: int = 3) -> str:
    """'0.984' when the values round alike, else '0.984–0.985' (least–most)."""
    low, high = (f"{v:.{digits}f}" for v in (min(values), max(values)))
    return low if low == high else f"{low}–{high}"


def tiny_flops(s: dict) -> float:
    return s["scales"]["tiny"]["arms"]["baseline"]["per_seed"]["1"]["train_flops_per_token"]


def small_flops(s: dict) -> float:
    return s["scales"]["small"]["arms"]["baseline"]["per_seed"]["1"]["train_flops_per_token"]


def cluster_estimate(summary: dict) -> tuple:
    """The GPU-hours `tools/study_cluster.py submit` prints by scale, its MFU tied to the 135M run it names."""
    from cplm_megatron.experiments.study import cluster

    assert round(summary["training"]["small"]["base_megatron"]["mfu_full_attention"], 2) == cluster.ASSUMED_MFU
    hours = cluster_hours()
    return hours["135m"], hours["360m"], sum(hours.values()), cluster.ASSUMED_MFU


@lru_cache(maxsize=None)
def cluster_runs() -> tuple:
    """The default cluster study's runs as `tools/study_cluster.py submit` plans them (an empty corpus layout)."""
    import tempfile

    from cplm_megatron.experiments.study.cluster import ClusterStudySettings, plan

    with tempfile.TemporaryDirectory() as tmp:
        for split in ("train", "dev", "val"):
            (Path(tmp) / split).mkdir()
            (Path(tmp) / split / "manifest.json").write_text("{}")
        settings = ClusterStudySettings(data=tmp, slurm_dir=str(REPO / "slurm"))
        return tuple(run for _, run in plan(settings, Path(tmp) / "out"))


def cluster_hours() -> dict:
    """The default cluster study's GPU-hours per scale."""
    hours: dict = {}
    for run in cluster_runs():
        hours[run.scale] = hours.get(run.scale, 0.0) + run.gpu_hours
    return hours


def cluster_plan() -> tuple:
    """The default cluster study's runs, steps, and tokens per run (billions) at 135M and 360M."""
    from cplm_megatron.experiments.study.cluster import ClusterStudySettings

    settings, runs = ClusterStudySettings(), cluster_runs()
    tokens = {run.scale: run.labels["tokens_per_step"] * run.labels["iters"] / 1e9 for run in runs}
    return len(runs), settings.iters, tokens["135m"], tokens["360m"]


def first_study_baseline(s: dict) -> float:
    stats = s["scales"]["tiny"]["arms"]["baseline"]["mean_std"]
    assert stats["copy_accuracy"]["mean"] == stats["passkey_accuracy"]["mean"]
    return stats["copy_accuracy"]["mean"]


def aux_terms(s: dict) -> tuple:
    t = s["scales"]["tiny"]
    n, mix, aux1 = len(t["seeds"]), t["vs_baseline"]["mixture"], t["arms"]["aux1"]
    assert wins(t["vs_baseline"]["aux1"]) == wins(t["vs_cache"]["aux1"]) == n
    return (wins(mix), n, mix["mean"], n - wins(t["vs_cache"]["mixture"]), n, t["vs_cache"]["mixture"]["mean"],
            t["arms"]["mixture"]["mean_std"]["lm_val_loss"]["mean"], t["arms"]["baseline"]["mean_std"]["val_loss"]["mean"],
            n, n, aux1["mean_std"]["lm_val_loss"]["mean"])


# --- the registry -------------------------------------------------------------------------------------------------

SUMMARY_GPU = f"{GPU}/check_summary.json"

def emergence_copying(s: dict) -> tuple:
    """The emergence study's seed-1 baselines: held-out text copy accuracy vs first occurrence (code, prose), the
    threshold and where the gain passed it (M tokens), random-token copy accuracy."""
    code, prose = (s["emergence"][f"{d}-baseline-s1"] for d in ("code", "prose"))
    return (code["final_text_copy_accuracy"], code["final_text_copy_first_accuracy"],
            prose["final_text_copy_accuracy"], prose["final_text_copy_first_accuracy"], s["settings"]["copy_threshold"],
            code["text_copy_emerges"]["tokens"] / 1e6, prose["text_copy_emerges"]["tokens"] / 1e6,
            code["final_copy_accuracy"], prose["final_copy_accuracy"])


def emergence_row(s: dict, domain: str) -> tuple:
    """A domain's seed-1 row: baseline, control and aux1 val loss; aux1 minus each on the same documents with its
    bootstrap interval; the baseline's and aux1's text copy gain."""
    scale = s["scales"][domain]
    base, aux1 = (scale["arms"][a]["per_seed"]["1"] for a in ("baseline", "aux1"))
    vs_base, vs_cache = scale["vs_baseline"]["aux1"], scale["vs_cache"]["aux1"]
    return (base["val_loss"], base["cache_val_loss"], aux1["val_loss"],
            *vs_base["document_interval_per_seed"]["1"], *vs_cache["document_interval_per_seed"]["1"],
            s["emergence"][f"{domain}-baseline-s1"]["final_text_copy_gain"],
            s["emergence"][f"{domain}-aux1-s1"]["final_text_copy_gain"])


def emergence_shape(s: dict) -> tuple:
    """Seeds finished by every arm on every domain and seeds planned, the grid's model and tokens per run."""
    m = s["scales"]["code"]["model"]
    complete = min(sum(all(str(seed) in arm["per_seed"] for arm in scale["arms"].values()) for seed in scale["seeds"])
                   for scale in s["scales"].values())
    return (complete, len(s["settings"]["seeds"]), m["hidden"], m["layers"], m["vocab"],
            s["scales"]["code"]["tokens"] / 1e6)


def emergence_second_seed(s: dict, domain: str = "code") -> tuple:
    """A domain's seed-2 baseline: held-out text copy accuracy vs first occurrence, the gain, where it passed the
    threshold (M tokens); its val loss and with the cache."""
    run = s["emergence"][f"{domain}-baseline-s2"]
    base = s["scales"][domain]["arms"]["baseline"]["per_seed"]["2"]
    return (run["final_text_copy_accuracy"], run["final_text_copy_first_accuracy"], run["final_text_copy_gain"],
            run["text_copy_emerges"]["tokens"] / 1e6, base["val_loss"], base["cache_val_loss"])


def emergence_helps(s: dict) -> tuple:
    """The cache control's share of aux1's gain per domain, and aux1's LM head alone (code, prose)."""
    seed = {d: {a: s["scales"][d]["arms"][a]["per_seed"]["1"] for a in ("baseline", "aux1")} for d in ("code", "prose")}
    share = [(f["baseline"]["val_loss"] - f["baseline"]["cache_val_loss"]) / (f["baseline"]["val_loss"] - f["aux1"]["val_loss"])
             for f in seed.values()]
    return (*share, *(f["aux1"]["lm_val_loss"] for f in seed.values()))

def emergence_seeds(s: dict, domain: str) -> tuple:
    """A domain over seeds: aux1's and the baseline's val loss (mean, std), aux1 minus the baseline and minus the cache
    control with their t intervals over seeds."""
    scale = s["scales"][domain]
    aux1, base = (scale["arms"][a]["mean_std"]["val_loss"] for a in ("aux1", "baseline"))
    vs_base, vs_cache = scale["vs_baseline"]["aux1"], scale["vs_cache"]["aux1"]
    return (aux1["mean"], aux1["std"], base["mean"], base["std"],
            *(v[k] for v in (vs_base, vs_cache) for k in ("mean", "ci_low", "ci_high")))


def emergence_second_aux1(s: dict) -> tuple:
    """The seed-2 code aux1 run: its val loss and held-out text copy gain."""
    return (s["scales"]["code"]["arms"]["aux1"]["per_seed"]["2"]["val_loss"],
            s["emergence"]["code-aux1-s2"]["final_text_copy_gain"])

QUOTES = [
    # README.md, ## Results
    Quote("README.md", "tokens/s: the mean over the steps after the first {}", (SUMMARY_GPU,),
          lambda s: s["training"]["small"]["base_megatron"]["warmup_steps_excluded"]),
    Quote("README.md", "At 1.7B the copy head costs {:.1f}-{:.1f}% of the step time, and {:.0f}% MFU", (GPU, GPU),
          lambda r, _: (*overheads_1p7b(r), 100 * gpu_runs(r)["1p7b_4k_base_g16"].mfu_full)),
    Quote("README.md", "took {:.1f}-{:.1f}x SDPA flash attention's time at the same shape (T {}k-{}k)",
          (SUMMARY_GPU,), kernel_vs_flash),
    Quote("README.md", "within {}% of every measured peak (peak/estimate {:.3f}-{:.3f} over {} runs)", (GPU,),
          planner_ratios),
    Quote("README.md", "the estimates the check recorded, from the planner it ran, were low (peak/estimate "
          "{:.2f}-{:.2f})", (SUMMARY_GPU,), recorded_ratios),
    Quote("README.md", "{:.1f}M training tokens per run", (STUDY,), lambda s: s["scales"]["tiny"]["tokens"] / 1e6),
    Quote("README.md", "| tiny (hidden {}, {} layers, {} seeds) | {} | {} | {} | {} | {} |", (STUDY,),
          lambda s: readme_row(s, "tiny")),
    Quote("README.md", "| small (hidden {}, {} layers, {} seeds) | {} | {} | {} | {} | {} |", (STUDY,),
          lambda s: readme_row(s, "small")),
    Quote("README.md", "The cache alone buys {:.0%} (tiny) and {:.0%} (small) of the CPLM's gain", (STUDY,),
          cache_share),
    Quote("README.md", "(copy accuracy 0.000 in {} of {} runs, {:.3f} in {} seed {}: {} of {} tokens)",
          (STUDY, STUDY_RUNS), baseline_copying),
    # README.md: the emergence study (results/emergence_cpu)
    Quote("README.md", "### Once the baseline copies: code and prose on CPU (seed {} of {} so far) Hidden {}, {} layers, "
          "vocabulary {}, {:.1f}M training tokens per run", (EMERGENCE,), emergence_shape),
    Quote("README.md", "of a validation document it predicts {:.3f} of the tokens against {:.3f} at their first occurrence "
          "on code and {:.3f} against {:.3f} on prose (the gain passes {:g} after {:.1f}M and {:.1f}M tokens); it still "
          "does not copy uniform random tokens ({:.3f} and {:.3f})", (EMERGENCE,),
          emergence_copying),
    Quote("README.md", "| code | {:.3f} | {:.3f} | {:.3f} | {:+.3f} [{:+.3f}, {:+.3f}] | {:+.3f} [{:+.3f}, {:+.3f}] | "
          "{:.3f} / {:.3f} |", (EMERGENCE,), lambda s: emergence_row(s, "code")),
    Quote("README.md", "| prose | {:.3f} | {:.3f} | {:.3f} | {:+.3f} [{:+.3f}, {:+.3f}] | {:+.3f} [{:+.3f}, {:+.3f}] | "
          "{:.3f} / {:.3f} |", (EMERGENCE,), lambda s: emergence_row(s, "prose")),
    Quote("README.md", "the cache alone buys {:.0%} (code) and {:.0%} (prose) of its gain. Where it does not help: the "
          "CPLM's LM head alone scores {:.3f} (code) and {:.3f} (prose), worse than the baseline", (EMERGENCE,),
          emergence_helps),
    Quote("README.md", "The second code baseline (seed 2) copies too: {:.3f} against {:.3f} (gain {:.3f}, past 0.1 after "
          "{:.1f}M tokens), validation loss {:.3f} and {:.3f} with the cache", (EMERGENCE,), emergence_second_seed),
    Quote("README.md", "the second prose baseline too: {:.3f} against {:.3f} (gain {:.3f}, past 0.1 after {:.1f}M "
          "tokens), validation loss {:.3f} and {:.3f} with the cache", (EMERGENCE,),
          lambda s: emergence_second_seed(s, "prose")),
    Quote("README.md", "On prose too: `aux1` {:.3f} ± {:.3f} against the baseline's {:.3f} ± {:.3f}, `aux1` minus the "
          "baseline {:+.3f} [{:+.3f}, {:+.3f}] and minus the cache control {:+.3f} [{:+.3f}, {:+.3f}].", (EMERGENCE,),
          lambda s: emergence_seeds(s, "prose")),
    Quote("docs/evaluation.md", "; on prose: {:+.3f} [{:+.3f}, {:+.3f}] and {:+.3f} [{:+.3f}, {:+.3f}])",
          (EMERGENCE,), lambda s: emergence_seeds(s, "prose")[4:]),
    Quote("README.md", "On code both arms have two seeds now: `aux1` {:.3f} ± {:.3f} against the baseline's {:.3f} ± "
          "{:.3f}, `aux1` minus the baseline {:+.3f} [{:+.3f}, {:+.3f}] and minus the cache control {:+.3f} [{:+.3f}, "
          "{:+.3f}] (95% t intervals over seeds", (EMERGENCE,), lambda s: emergence_seeds(s, "code")),
    Quote("docs/evaluation.md", "(on code over two seeds: {:+.3f} [{:+.3f}, {:+.3f}] and {:+.3f} [{:+.3f}, {:+.3f}];",
          (EMERGENCE,), lambda s: emergence_seeds(s, "code")[4:]),
    Quote("results/emergence_cpu/README.md", "`code-aux1-s2` (val loss {:.3f}; held-out text copy gain {:.3f})",
          (EMERGENCE,), emergence_second_aux1),
    Quote("results/emergence_cpu/README.md", "`code-baseline-s2` (it copies too: held-out text copy {:.3f} against {:.3f} "
          "at first occurrence, gain {:.3f}; val loss {:.3f}, with the cache {:.3f})", (EMERGENCE,),
          lambda s: tuple(v for i, v in enumerate(emergence_second_seed(s)) if i != 3)),
    # docs/evaluation.md: the first ablation
    Quote("docs/evaluation.md", "| untied (V = 4096, 8192, 16384) | 0 (already at init) | 0.992 / {} (all three) | "
          "not within 60 | 0.000 / ≈ 1/V ({} – {}) | | tied (V = 4096, 8192, 16384) | 0 | 0.992 / {} | 0 (tied "
          "embeddings make e_v·e_v the top logit) | {:.2f}–{:.2f}, falling / ≈ 2/V | The copy head is right from "
          "initialization because every candidate proposes the repeated symbol; training raises its gate so "
          "p(target) climbs from {:.2f}-{:.2f} to 0.98 within 60 steps", (f"{ABLATION}/results.json",),
          lambda r: spamlang_ablation(r)[:8]),
    Quote("docs/evaluation.md", "(`tools/ablate.py --output results/ablation_cpu`, {} s)", (f"{ABLATION}/results.json",),
          lambda r: spamlang_ablation(r)[8]),
    Quote("docs/evaluation.md", "the gate averaged {:.2f}-{:.2f} from step 50 on, the LM head received little gradient "
          "(its own validation cross entropy at step 600 was {:.2f}-{:.2f} nats where the baseline's was "
          "{:.2f}-{:.2f}) and in {} of {} seeds the CPLM ended worse than the baseline (val loss {} vs {}), while "
          "the auxiliary LM-only cross entropy at weight 1 won in every seed by {:.2f}–{:.2f} nats", (ABLATION,),
          corpus_comparison),
    # docs/evaluation.md: the recipe study
    Quote("docs/evaluation.md", "`aux1+copy` (beat the cache control by only {:.3f} where `aux1` won by {:.3f}) and "
          "`sentinel` (lost to the cache control, {:+.3f})", ("results/study_cpu_v2/runs",), v2_retirements),
    Quote("docs/evaluation.md", "for {} steps of 8 × 256 tokens ({:.1f}M)", (STUDY,),
          lambda s: (s["scales"]["tiny"]["model"]["iters"], s["scales"]["tiny"]["tokens"] / 1e6)),
    Quote("docs/evaluation.md", "tiny (hidden 64, 4 layers, {:.1f}M training FLOPs per token)", (STUDY,),
          lambda s: s["scales"]["tiny"]["arms"]["baseline"]["per_seed"]["1"]["train_flops_per_token"] / 1e6),
    Quote("docs/evaluation.md", "small (hidden 128, 8 layers, {:.1f}M FLOPs per token: {:.1f}×)", (STUDY,),
          lambda s: (small_flops(s) / 1e6, small_flops(s) / tiny_flops(s))),
    Quote("docs/evaluation.md", "a tiny run trained in {}-{} s ({}-{} tokens/s) and evaluated in {}-{} s (every "
          "validation sample, copy, passkey to 1024 tokens, gradient; the cache control on the baselines); a small run "
          "trained in {}-{} s and evaluated in {}-{} s. The grid took {} s, {:.1f} core-hours.", (STUDY_RUNS, STUDY),
          study_cost),
    Quote("docs/evaluation.md", "**The grid is complete** ({} of {} runs: tiny {} seeds x {} arms, small {} seeds x {} "
          "arms;", (STUDY,), grid_counts),
    Quote("docs/evaluation.md", "- **Tiny** (baseline {:.2f} nats, baseline + cache control {:.2f}): every trained arm "
          "is below the baseline in every seed (`aux1` {}, `sentinel+aux1` {}, `mixture` {}); against the cache control "
          "`aux1` wins in {} of {} seeds ({}) and so does `sentinel+aux1` ({}), while `mixture` loses in {} of {} ({}); "
          "`sentinel+aux1` - `aux1` = {} ({} of {} seeds: the interval includes 0).", (STUDY,), tiny_results),
    Quote("docs/evaluation.md", "- **Small** ({:.1f}x the FLOPs per token, the same tokenizer and validation set; "
          "baseline {:.3f}, cache control {:.3f}): `aux1` {} vs the baseline and {} vs the cache control, {} of {} "
          "seeds each; `sentinel+aux1` {} vs the baseline but {} vs the cache control, losing to it in seed 1 ({:+.3f}) "
          "and winning in seeds 2 and 3, and {} vs `aux1` (its LM head alone {:.2f} vs the baseline's {:.2f} and "
          "`aux1`'s {:.2f}).", (STUDY,), small_results),
    Quote("docs/evaluation.md", "Passkey accuracy on the first key token is low but not at chance ({}) for every arm: "
          "`aux1` and the baseline retrieve {} of {:,} samples at tiny and {} of {:,} at small ({}-{}x chance), "
          "`sentinel+aux1` {} of {} and {} of {} ({:.3f} / {:.3f}), `mixture` {} of {} at tiny ({:.3f}, {:.0f}x "
          "chance).", (STUDY,), passkey_counts),
    Quote("docs/evaluation.md", "Copy accuracy (mean, tiny / small) {:.2f} / {:.2f} (`aux1`), {:.2f} / {:.2f} "
          "(`sentinel+aux1`), {:.2f} (`mixture`, tiny) vs chance {}, the baseline's <= {:.3f} and the "
          "one-token-match copier's {:.3f} on the same samples", (STUDY,), copy_means),
    Quote("docs/evaluation.md", "- **SpamLang at vocabulary {}** (`aux1` vs the baseline, untied LM head; "
          "`spamlang_h64_s1/`: hidden {}, seed {}, {} steps, and `summary.json`'s `spamlang`): the CPLM is at {:.3f} "
          "accuracy from step 0 (p(target) {:.3f} at step {}), the (L-1)/L ceiling that the trivial copiers reach too: "
          "the previous-token copier {:.3f} and the untrained baseline + a continuous cache {:.3f} at every step; the "
          "baseline stays at 0.000 with its loss at ln V ({:.3f} vs {:.3f}; p(target) {}, 1/V = {}): an untied LM "
          "head sees each symbol a few times in {} steps.", (STUDY,), spamlang_600),
    Quote("docs/evaluation.md", "The earlier {}-step runs (`spamlang_h64/`, `spamlang_h128/`, one seed) agree (CPLM "
          "0.992 from step 0, p(target) {:.2f} at step {}; baseline 0.000, p(target) {} and {})", (H64, H128), spamlang_60),
    Quote("docs/evaluation.md", "logit gradient outside its column span is {:.5f} and {:.5f} at hidden 64 and 128, its "
          "chance value sqrt(1 - d/V) at both widths", (H64, H128), gradient_share),
    Quote("docs/evaluation.md", "no baseline learned to copy in context (copy accuracy 0.000 in {} of {} runs, {:.3f} in "
          "{} seed {}: {} of {} tokens)", (STUDY, STUDY_RUNS), baseline_copying),
    Quote("docs/evaluation.md", "the test-time cache alone buys {:.0%} (tiny) and {:.0%} (small) of `aux1`'s gain",
          (STUDY,), cache_share),
    Quote("docs/evaluation.md", "~{:.0f} GPU-hours at 135M and ~{:.0f} at 360M (~{:.0f} in all: training FLOPs from "
          "`model/sizing/accounting.py` at {:.0%} of an H100's bf16 peak, the MFU measured at 135M on one H200",
          (SUMMARY_GPU,), cluster_estimate),
    Quote("docs/evaluation.md", "the two scales is {} runs of {} steps at the recipes' batches ({:.1f}B tokens per run "
          "at 135M, {:.1f}B at 360M)", (), cluster_plan),
    Quote("docs/evaluation.md", "## The ablation on CPU (tiny scale: hidden {}, 4 layers, {} steps of 8 × 256 tokens",
          (f"{ABLATION}/results.json",),
          lambda r: (r["meta"]["settings"]["hidden_size"], r["meta"]["settings"]["corpus_iters"])),
    Quote("docs/evaluation.md", "the hidden size, {} steps (`tools/ablate.py --output results/ablation_cpu`",
          (f"{ABLATION}/results.json",), lambda r: r["meta"]["settings"]["spamlang_iters"]),
    Quote("docs/evaluation.md", "**Embedded corpus, the first comparison** ({} steps, vocabulary {} = 64× hidden",
          (f"{ABLATION}/results.json",), lambda r: (r["meta"]["settings"]["corpus_iters"],
                                                   r["runs"]["corpus-baseline"]["label"]["vocab"])),
    # docs/design.md: the recipe defaults and the auxiliary terms
    Quote("docs/design.md", "the SpamLang runs at vocabulary {:,} ({} and {} steps)",
          (STUDY, H64),
          lambda s, h64: (s["spamlang"][0]["vocab"], h64["spamlang"][0]["iters"], s["spamlang"][0]["iters"])),
    Quote("docs/design.md", "at the first study's tiny scale the baseline's copy and passkey accuracy were {:.3f}",
          ("results/study_cpu/summary.json",), first_study_baseline),
    Quote("docs/design.md", "**The grid is complete** ({} of {} runs: tiny {} seeds x {} arms, small {} seeds x {} "
          "arms;", (STUDY,), grid_counts),
    Quote("docs/design.md", "below the baseline (tiny {}, small {} nats, 95% t intervals over seeds) and below the "
          "baseline + cache control ({} and {}) in every seed", (STUDY,),
          lambda s: tuple(interval(s["scales"][sc][kind]["aux1"]) for kind in ("vs_baseline", "vs_cache")
                          for sc in ("tiny", "small"))),
    Quote("docs/design.md", "the pure mixture beat the bare baseline in {} of {} seeds ({:.3f} nats) but lost to the "
          "baseline + cache control in {} of {} ({:+.3f}), and its LM head alone fell to {:.2f} nats against the "
          "baseline's {:.2f}: the starved LM head. `lm_loss_weight: 1` beat both controls in {} of {} seeds with its "
          "LM head alone at {:.2f}.", (STUDY,), aux_terms),
    # docs/performance.md
    Quote("docs/performance.md", "| SmolLM2-135M, seq 2048, micro 8, Megatron's LM-head loss | {} | {} / {} | {:.1f} | "
          "| the same with the chunked LM-head loss | {} | {} / {} | {:.1f} | | SmolLM2-1.7B, seq 4096, micro 4, four "
          "micro-batches per step | {} | {} / {} | {:.1f} | | the same with the copy head | {} ({} step time) | | {:.1f} "
          "| | transformers Llama 135M (fp32 weights + bf16 autocast, fused AdamW), eager / torch.compile | {} / {} | | "
          "{:.1f} / {:.1f} |", (GPU,), performance_table),
    Quote("docs/performance.md", "the copy head costs {:.1f}-{:.1f}% of the step time. At 135M we trained at {:.2f}x "
          "transformers eager and {:.2f}x transformers with torch.compile: a 135M step launches ~{} kernels and spends "
          "only ~{}% of its GPU time in matrix multiplies", (GPU, f"{GPU}/profile_135m_megatron_loss.json"),
          lambda r, prof: (*overheads_1p7b(r), *versus_peer_135m(r), *(profile_135m(prof)[i] for i in (0, 3)))),
    Quote("docs/performance.md", "the loss itself took {} ms with Megatron's path, {} ms fused and {} ms chunked, which "
          "made a whole 135M step {:.2f}x slower with `chunked`; at 1.7B (seq 2048, micro-batch 2) the chunked loss's "
          "extra time over Megatron's path, 2 x ({} - {}) ms at hidden 2048, is ~{:.0f}% of the {:.0f} ms step.",
          (f"{GPU}/check_rerun_summary.json", SUMMARY_GPU), chunked_cost),
    Quote("docs/performance.md", "it is within {:+.1f}% to {:+.1f}% over {} runs (135M: {:.2f} estimated vs {:.2f} "
          "measured with Megatron's loss, {:.2f} vs {:.2f} chunked; 1.7B seq 2048: {:.2f} vs {:.2f}; 1.7B seq 4096 "
          "micro 4: {:.2f} vs {:.2f})", (GPU,), planner_examples),
    # docs/benchmarks.md
    Quote("docs/benchmarks.md", "| tiny (hidden 128, 4 layers, vocab 4096) | {} | {} | {} | {} | {} | {} | {} | | tiny | "
          "{} | {} | {} | {} | {} | {} | {} | | SmolLM2-135M shape, 2 layers (vocab 49152) | {} | {} | {} | {} | {} | {} "
          "| {} | | SmolLM2-135M shape, 2 layers | {} | {} | {} | {} | {} | {} | {} |",
          ("results/copy_head_overhead_cpu.json",), overhead_rows),
    Quote("docs/benchmarks.md", "The head costs {:.0f}% of a step at 135M width and seq 2048",
          ("results/copy_head_overhead_cpu.json",), lambda b: 100 * (b["rows"][3]["time_ratio"] - 1)),
    Quote("docs/benchmarks.md", "| {} | {} | {} ms | {} ms | {} | {} | {} | {} | | {} | {} | {} ms | {} ms | {} | {} | "
          "{} | {} | | {} | {} | {} ms | {} ms | {} | {} | {} | {} | The fused Triton kernels run on CPU only in the "
          "interpreter (correctness, not speed; its extra memory at T = 64 is {:.1f} KiB forward",
          ("results/copy_kernel_cpu.json",), copy_kernel_rows),
    Quote("docs/benchmarks.md", "the fused forward+backward takes {} / {} / {} ms at T = 4k / 16k / 32k (d 64, 4 heads) "
          "against SDPA flash attention's {} / {} / {} ms at the same shape ({}x / {}x / {}x), the FP8 forward "
          "{:.2f}-{:.2f}x the bf16 one (FP8 is a precision option, not a speed one, at this width), and the extra "
          "memory is {:.2f}% of the naive path's at 32k", (SUMMARY_GPU,), kernel_times),
    Quote("docs/benchmarks.md", "| {} | {} | {} s, {} MiB | {} s, {} MiB | {}% | {}x | (seq 2048: not the rule) | | {} | "
          "{} | {} s, {} MiB | {} s, {} MiB | {}% | {}x | met | | {} | {} | {} s, {} MiB | {} s, {} MiB | {}% | {}x | "
          "(seq 2048: not the rule) | | {} | {} | {} s, {} MiB | {} s, {} MiB | {}% | {}x | met |",
          ("results/lm_head_loss_cpu.json",), lm_head_cpu_rows),
    Quote("docs/benchmarks.md", "(on one H200 at hidden 576 / seq 2048: Megatron's path {} ms, `fused` {} ms, `chunked` "
          "{} ms)", (f"{GPU}/check_rerun_summary.json",), lambda r: tuple(lm_head_rows(r)[i] for i in (0, 2, 1))),
    Quote("docs/benchmarks.md", "| context length | {} | |---|---:|---:|---:|---:|---:|---:|---:|---:| | model scored | "
          "short phase | short phase | short phase | short phase | 8k phase | 8k phase | 8k phase | 8k phase | | CPLM copy "
          "accuracy | {} | | one-token match (no model) | {} | | baseline copy accuracy | {} | | CPLM passkey, first key "
          "token | {} | | baseline passkey, first key token | {} | | CPLM mean gate on the repeat | {} | Chance: copy {}, "
          "passkey first token {} (1 in {}).", ("results/long_context/long_context_cpu.json",), long_context_table),
    Quote("docs/benchmarks.md", "its loss stays at ln {} = {:.3f} ({:.3f} after the short phase, {:.3f} after the long "
          "one) and every score is at chance. The CPLM's copy head finds copies by content: at its training length "
          "(256) it beats the one-token match ({}: it matches more than the current token), beyond it it falls below "
          "({} at 512); after 30 steps at 8k with CP=2 it is at about the one-token match at 4k-16k ({}, {}, {}) and "
          "below it at 32k ({}).", ("results/long_context/long_context_cpu.json",),
          lambda b: long_context_prose(b)[:10]),
    Quote("docs/benchmarks.md", "{} of 6 at 4k and 8k, {} of 6 at 16k, none at 32k", (
          "results/long_context/long_context_cpu.json",), lambda b: long_context_prose(b)[10:12]),
    Quote("docs/benchmarks.md", "Cost on one core: training {} + {} s (baseline) and {} + {} s (CPLM), scoring {} s and "
          "{} s (CPLM at 32k: {} s)", ("results/long_context/long_context_cpu.json",),
          lambda b: long_context_prose(b)[12:]),
    Quote("docs/benchmarks.md", "span; {} short steps), kept as `long_context_cpu_copy.{{json,png}}`, is the reason for "
          "`copy_random`: that CPLM copied at exactly 256 ({:.3f}) and at neither 128 ({:.3f}) nor 512 ({:.3f})",
          ("results/long_context/long_context_cpu_copy.json",), copy_task_run),
    # docs/data.md
    Quote("docs/data.md", "corpus's training split, {} files, {:.1f} MB, {:.2f}M tokens of its 4096-token BPE, one thread "
          "on one core of a shared 2-core AMD EPYC VM, process CPU time, median of 5. Tokenizing {:.0f}k tokens/s per "
          "core, packing and writing zstd MDS shards with hashes {}k tokens/s, reading {}M+ tokens/s (`.py` or "
          "`.jsonl.zst`); the whole `prepare_dataset` (one `--part` with `--workers 1`) {:.0f}k tokens/s, i.e. "
          "**{:.0f} core-hours** per 100B tokens ({:.0f}-{:.0f} across the {} repetitions: the core was shared with "
          "other jobs), about {:.1f} h on one 64-core node or {:.0f} min on 16. The tokenizer is the cost: the writing "
          "stage alone is ~{:.0f}x faster", ("results/data_prep_cpu.json",), data_prep),
    Quote("docs/data.md", "Built from the test environment's `.venv` ({} distributions, {:.1f} MB of sources) on one core "
          "in {:.0f} s: {:.2f}M training tokens; {} validation documents, {:.2f}M tokens, the largest {:.2f}%; dev {} "
          "documents, {:.2f}M tokens; {:.2f}% of the validation shingles occur in train",
          ("results/code_corpus/build_cpu_2026-12-04.json",), code_corpus),
    # docs/checkpoints.md
    Quote("docs/checkpoints.md", "| tiny ({:.1f}M parameters, Adam state) | {:.1f} MB | {} | {} ({:.0f}%) | {} | {} "
          "({:.0f}%) | | SmolLM2-135M (Adam state) | {:.2f} GB | {} | {} ({:.0f}%) | {} | {} ({:.0f}%) |",
          ("results/checkpoint_checksums_cpu.json",), checksum_rows),
    # docs/gpu-check.md, docs/troubleshooting.md
    Quote("docs/gpu-check.md", "three steps stopped by budgets that were too short (install {} s, compat {} s, "
          "lm_head_loss {} s", (SUMMARY_GPU,), lambda s: tuple(
              next(st["budget_s"] for st in s["steps"] if st["name"] == name and st["rc"] == 124)
              for name in ("install", "compat", "lm_head_loss"))),
    Quote("docs/troubleshooting.md", "the estimate is within about {}% of the peaks measured on an H200", (GPU,),
          lambda r: planner_ratios(r)[0]),
    # results/gpu/2026-12-04/README.md
    Quote(f"{GPU}/README.md", "first pass ({} s of its {} s of budgets)", (SUMMARY_GPU,),
          lambda s: (s["wall_s"], s["budget_limit_s"])),
    Quote(f"{GPU}/README.md", "recorded (the planner at 1661af4, low: peak/estimate {:.2f}-{:.2f}) and the current "
          "planner's (peak/estimate {:.3f}-{:.3f})", (SUMMARY_GPU, GPU),
          lambda s, r: (*recorded_ratios(s), *planner_ratios(r)[1:3])),
    Quote(f"{GPU}/README.md", "fused forward+backward {} / {} / {} ms at T = 4k / 16k / 32k against SDPA flash {} / {} / "
          "{} ms ({}x / {}x / {}x); the FP8 forward {:.2f}-{:.2f}x bf16; extra memory {:.2f}% of the naive path's at "
          "32k", (SUMMARY_GPU,), kernel_times),
    Quote(f"{GPU}/README.md", "The fused kernels pass the CPU reference at T={} in bf16, fp32 and FP8, d {} and {} "
          "(logsumexp error <= {} in bf16/fp32, <= {} in FP8)", (SUMMARY_GPU,), kernel_errors),
    Quote(f"{GPU}/README.md", "Copy-score kernel (d {}, {} heads)", (SUMMARY_GPU,),
          lambda s: next((r["head_dim"], r["heads"]) for r in s["copy_kernel"].values())),
    Quote(f"{GPU}/README.md", "MFU: matrix-multiply FLOPs at the H200's dense bf16 peak ({:.0f} TFLOP/s)",
          (SUMMARY_GPU,), lambda s: s["training"]["small"]["base_megatron"]["peak_tflops"]),
    Quote(f"{GPU}/README.md", "ran faster per step than its chunked baseline, one {}-step run each", (SUMMARY_GPU,),
          lambda s: s["training"]["small"]["cplm_chunked"]["iterations"]),
    Quote(f"{GPU}/README.md", "LM-head loss (V {:,}, the rerun)", (f"{GPU}/check_rerun_summary.json",),
          lambda r: r["lm_head_loss"]["rows"][0]["vocab"]),
    Quote(f"{GPU}/README.md", "Megatron's path {} ms, chunked {} ms, fused {} ms at hidden 576 / seq 2048; {} / {} / {} "
          "ms at seq 8192; {} / {} / {} ms at hidden 2048 (working memory {} / {} / {} MiB at 576)",
          (f"{GPU}/check_rerun_summary.json",), lm_head_rows),
    Quote(f"{GPU}/README.md", "at 135M ~{} kernel launches per step ({} cudaLaunchKernel and {} cuLaunchKernelEx "
          "calls), matrix multiplies ~{}% of the step's GPU time", (f"{GPU}/profile_135m_megatron_loss.json",),
          profile_135m),
    Quote(f"{GPU}/README.md", "the optimizer step takes {:.1f} ms of {:.0f} ms", (f"{GPU}/profile_1p7b_chunked.json",),
          profile_1p7b),
]


@pytest.mark.parametrize("quote", QUOTES, ids=lambda q: f"{q.page}:{normalized(q.text)[:48]}")
def test_each_quoted_figure_is_its_records(quote: Quote):
    rendered = quote.render()
    assert rendered in page(quote.page), f"{quote.page} should say: {rendered}"


# --- the generated GPU tables -------------------------------------------------------------------------------------

@pytest.mark.parametrize("target, args", [("README.md", []), (f"{GPU}/README.md", ["--results-readme"])])
def test_the_gpu_tables_are_printed_from_the_records(target: str, args: list):
    """README.md's and the lease README's tables are what `python -m benchmarks.gpu.results_table` prints, run as users
    do."""
    printed = subprocess.run([sys.executable, "-m", "benchmarks.gpu.results_table", GPU, *args],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert printed.returncode == 0, printed.stderr[-2000:]
    expected = gpu.readme_table(REPO / GPU) if not args else gpu.results_table(REPO / GPU)
    assert printed.stdout.strip() == expected
    assert expected in (REPO / target).read_text()


def test_the_table_generator_refuses_a_folder_without_a_check():
    printed = subprocess.run([sys.executable, "-m", "benchmarks.gpu.results_table", "results"],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert printed.returncode == 2 and printed.stderr.startswith("error: results has no check_summary.json")


def test_the_tables_step_rule_is_the_checks_and_differs_from_the_logged_average():
    """The 1.7B seq-4096 runs' tokens/s: per-step times are differences of `time`; the mean of steps 4..N equals
    (t_N - t_3)/(N - 3) by hand, and the trainer's logged running average (which counts the first steps) is slower."""
    lines = record(f"{GPU}/1p7b_seq4096_base_g16.metrics.jsonl")
    times = [line["time"] for line in lines]
    per_step = [b - a for a, b in zip(times, times[1:])][2:]  # steps 4..8
    run = gpu_runs(REPO / GPU)["1p7b_4k_base_g16"]
    assert run.step_time == pytest.approx(sum(per_step) / len(per_step), rel=1e-12)
    assert run.tokens_per_sec == pytest.approx(16 * 4096 / run.step_time) and run.tokens_per_sec > lines[-1]["tokens_per_sec"]


# --- coverage: every figure of these sections is registered -------------------------------------------------------

SPLIT = "the validation split's figures (data/stdlib/split.json, built by make data, not a record under results/)"
COVERED = {  # page: its sections, each (its first line, the first line after it)
    "README.md": [("## Results", "## Quick start on a GPU cluster")],
    "docs/evaluation.md": [("## The ablation on CPU", "## Reproducing at 135M"),
                           ("Every active arm (baseline", "Throughput and scaling")],
    "docs/performance.md": [("## Measured on one H200", "## `model.lm_head_loss: auto`")],
    "docs/design.md": [("Why the auxiliary terms exist", "`decouple_lm` removes"),
                       ("**The grid is complete**", "`decouple_lm` stops")],
    f"{GPU}/README.md": [("## The figures", None)],
}
NAMES = {"aux1": "an arm", "sentinel+aux1": "an arm", "v1": "a study", "v2": "a study", "v2's": "a study",
         "v3": "a study", "H200": "the device", "H200's": "the device", "H100s": "the device", "sm_90": "an architecture",
         "135M": "a model", "1.7B": "a model", "135M–1.7B": "models", "hidden-64/128": "models",
         "SmolLM2-style": "a model", "FP8": "a number format", "bf16": "a number format", "2017": "a citation",
         "95%": "an interval's level"}
NOT_FIGURES = {
    "README.md": {**NAMES, "41-48%": "Megatron-LM's published MFU", "25%": "lm_head_choice's threshold, a setting"},
    "docs/evaluation.md": {**NAMES, **dict.fromkeys(("125", "284k", "1–24", "30%", "2.4%", "1.2%", "32-token", "3.11",
                                                     "106k", "42%", "23-document", "24%"), SPLIT),
                           "2-core": "the machine", "99%": "a threshold", "4096–16384": "settings",
                           "64–256×": "settings", "1–5": "seeds (settings)", "1–3": "seeds (settings)",
                           "75": "an exit code", "0.1": "the emergence threshold (a setting)",
                           "1,000": "the probe interval (a setting)"},
    "docs/design.md": {**NAMES, **dict.fromkeys(("32-token", "24%", "23", "42%"), SPLIT),
                       "128": "the first study's scored samples (a setting)", "1/(V-1": "a formula",
                       "1/(V-3": "a formula"},
    f"{GPU}/README.md": NAMES,
    "docs/performance.md": {**NAMES, "H100": "the device", "41-48%": "Megatron-LM's published MFU",
                            "2026-12-04": "the lease's date"},
}


def section(name: str) -> str:
    """The covered sections of a page, fenced code blocks left out (commands, not figures)."""
    text, parts = (REPO / name).read_text(), []
    for first, after in COVERED[name]:
        part = text[text.index(first):]
        parts.append(part[:part.index(after)] if after else part)
    return re.sub(r"```.*?```", " ", "\n".join(parts), flags=re.S)


def figures_in(text: str) -> list[str]:
    """The tokens with a digit, outside generated blocks, code spans, link targets and image lines."""
    text = re.sub(r"<!-- ([\w-]+):begin.*?<!-- \1:end -->", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"^!\[.*$", " ", text, flags=re.M)
    tokens = (t.strip("()[],;:.*!?|/") for t in text.split())
    return [t for t in tokens if re.search(r"\d", t)]


@pytest.mark.parametrize("name", sorted(COVERED))
def test_every_figure_of_a_covered_section_is_registered(name: str):
    quoted = " ".join(q.render() for q in QUOTES if q.page == name)
    allowed = NOT_FIGURES.get(name, {})
    loose = [t for t in figures_in(section(name))
             if t not in allowed and not re.search(rf"(?<![\w.]){re.escape(t)}(?![\w])", quoted)]
    assert not loose, f"{name}: figures without a Quote in tests/test_quoted_figures.py: {sorted(set(loose))}"
