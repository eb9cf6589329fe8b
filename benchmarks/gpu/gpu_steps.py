"""The Python steps of benchmarks/gpu/run_gpu_checks.sh: the install check (every module a step imports, from
the installed wheels), compat-layer scope check, and the summary that turns every step's raw output into the
figures of the README's GPU table.

    python -m benchmarks.gpu.gpu_steps install-check WORK_DIR   # modules from WORK_DIR/site; -> env.json
    python -m benchmarks.gpu.gpu_steps compat  WORK_DIR
    python -m benchmarks.gpu.gpu_steps summary WORK_DIR SUMMARY_JSON [--dry-run] [--budget-limit S] [--warmup-steps N]
    python -m benchmarks.gpu.gpu_steps lease-summary LEASE_OUT [--command first|rest] [--limit S] [--dry-run]

WORK_DIR holds the steps' files: plan.tsv (the planned steps and budgets, in order), steps.tsv (name, budget,
exit code or "interrupted", seconds; one row as each step ends), env.json, compat.json, kernel_check.json,
copy_kernel.json, train_<group>_<run>.json + .yaml + .metrics.jsonl (benchmarks/gpu/runs.py; the trainer's
run_record.json, or run_record_stopped_early.json when its budget stopped it, resolved config and per-step metrics:
the figures come from the per-step times after the warm-up steps), peer_<group>.json (benchmarks/gpu/hf_peer.py),
lm_head_loss.json, study.json (benchmarks/gpu/study_step.py, the installed cplm_megatron.experiments.gpu_study). The
summary runs after every step and from the script's EXIT trap, so it imports no torch (the memory estimate of
Megatron's LM-head path is torch-free) and reads partial files as they are.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from benchmarks.gpu.runs import SLOT_TITLES, group_runs, run_stem  # torch-free, as the summary must be
from benchmarks.ratios import ok_row, ratio

GPU_BUDGET_S = 360  # one pass + a machine start leave the 4 minutes a second start needs in a 15-minute lease
TRAIN_STEPS = {"check": "train", "perf": "perf_train"}  # the step that trains each group's runs
PEER_STEPS = {"check": "peer", "perf": "perf_peer"}
# Every module a step imports from the project and megatron-core (the install check imports them all and each
# must come from the private site dir, not from the checkout or an editable install)
STEP_MODULES = ("megatron.core", "cplm_kernels", "cplm_kernels.configs", "cplm_kernels.linear_ce", "cplm_megatron",
                "cplm_megatron.recipes", "cplm_megatron.model.config", "cplm_megatron.model.sizing.accounting",
                "cplm_megatron.model.attention", "cplm_megatron.model.document_mask", "cplm_megatron.model.layout",
                "cplm_megatron.model.lm_head_loss", "cplm_megatron.parallel.megatron_patches",
                "cplm_megatron.parallel.distributed", "cplm_megatron.entry_points", "cplm_megatron.pretrain",
                "cplm_megatron.experiments.gpu_study.experiment")
FLOPS_CONVENTION = (
    "matmul FLOPs only (2mnk), training = 3 x forward (+ recomputed forward); mfu_full_attention counts attention "
    "scores and values (and the copy head's scores) at full T x T, the Megatron/PaLM convention the trainer logs; "
    "mfu_causal_attention counts them for the causal part only ((T+1)/2 keys per query). Peak: the trainer's "
    "per-device dense bf16 peak (H200: 989 TFLOP/s; CPU: a nominal 1)")


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def install_check(work: Path) -> int:
    """Import every module a step imports (STEP_MODULES) and load the recipes the steps use: each must come from
    WORK/site (the installed wheels). Versions, device and module origins -> env.json; exit 1 naming the first
    module that fails or comes from elsewhere."""
    import importlib

    site = (work / "site").resolve()
    origins: dict[str, str] = {}
    for name in STEP_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - the one-line error names the module
            print(f"error: import {name} failed: {type(err).__name__}: {err}")
            return 1
        origin = Path(module.__file__).resolve()
        origins[name] = str(origin)
        if site not in origin.parents:
            print(f"error: {name} comes from {origin}, not from the installed wheels in {site}")
            return 1
    from cplm_megatron.model.config import PRESET_DIR, available_presets, load_preset

    missing = sorted({"tiny", "smollm2-135m", "smollm2-1.7b"} - set(available_presets()))
    if missing:
        print(f"error: the installed wheel lacks the model presets {missing} (looked in {PRESET_DIR})")
        return 1
    for preset in ("tiny", "smollm2-135m", "smollm2-1.7b"):
        load_preset(preset)
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            **{dist: _version(dist) for dist in ("triton", "megatron-core", "cplm-megatron", "transformer-engine",
                                                 "transformers")},
            "module_origins": origins}
    (work / "env.json").write_text(json.dumps(info, indent=2))
    print(json.dumps({k: v for k, v in info.items() if k != "module_origins"}))
    print(f"OK: {len(STEP_MODULES)} modules from {site}")
    return 0


def check_compat(work: Path) -> int:
    """The compat layer's scope on this machine: on CUDA no CPU patch may apply; without Apex/TE every
    torch-fallback fix this megatron-core needs does. -> compat.json; exit 1 if either fails."""
    import torch

    from cplm_megatron.parallel.megatron_patches import PATCHES, apex_or_te_present, apply_compat, describe_compat

    applied = set(apply_compat())
    cuda = torch.cuda.is_available()
    cpu_leaked = sorted(applied & {p.name for p in PATCHES if p.scope == "cpu"}) if cuda else []
    fallback = {p.name for p in PATCHES if p.scope == "torch_fallback" and p.needed()}
    fallback_missing = [] if apex_or_te_present() else sorted(fallback - applied)
    ok = not cpu_leaked and not fallback_missing
    line = describe_compat(applied)
    (work / "compat.json").write_text(json.dumps(
        {"cuda": cuda, "applied": sorted(applied), "log_line": line, "cpu_patches_on_cuda": cpu_leaked,
         "torch_fallback_missing": fallback_missing, "ok": ok}, indent=2))
    print(line)
    print("OK" if ok else f"FAIL: CPU patches on CUDA {cpu_leaked}, torch-fallback fixes missing {fallback_missing}")
    return 0 if ok else 1


def _load(path: Path) -> Optional[Any]:
    """A step's JSON, or None if absent or unreadable (a step killed mid-write)."""
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None


def _field(rows: list[dict], field: str, impl: str, T: int, d: int, mode: str, dtype: str = "bf16") -> Optional[float]:
    row = ok_row(rows, impl=impl, T=T, d=d, mode=mode, dtype=dtype)
    return row[field] if row else None


def kernel_figures(report: Optional[dict]) -> dict[str, Any]:
    """Per (T, d): fused bf16 fwd+bwd vs SDPA flash and vs chunked, FP8 vs bf16 forward, extra memory vs naive."""
    if report is None:
        return {}
    rows = report["rows"]
    out: dict[str, Any] = {}
    for T, d in sorted({(r["T"], r["d"]) for r in rows if r["impl"] == "fused"}):
        fused, sdpa, chunked = (_field(rows, "time_ms", impl, T, d, "fwd+bwd") for impl in ("fused", "sdpa-flash", "chunked"))
        bf16_fwd, fp8_fwd = _field(rows, "time_ms", "fused", T, d, "fwd"), _field(rows, "time_ms", "fused", T, d, "fwd", "fp8")
        fused_mem = _field(rows, "extra_mem_bytes", "fused", T, d, "fwd+bwd")
        naive_mem = _field(rows, "extra_mem_bytes", "naive", T, d, "fwd+bwd")
        naive_basis = "measured"
        if naive_mem is None:  # the naive path ran out of memory: one fp32 [b, H, T, T] score tensor as the floor
            naive_mem = 4 * report["environment"]["batch"] * report["environment"]["heads"] * T * T
            naive_basis = "one fp32 [b,H,T,T] tensor (naive did not run)"
        env = report["environment"]
        out[f"T={T},d={d}"] = {
            "dtype": "bf16 (fp8_fwd_ms: e4m3 operands)", "seq_len": T, "head_dim": d, "micro_batch": env.get("batch"),
            "heads": env.get("heads"), "attention_impl": "copy-head scores: fused Triton kernel vs torch SDPA flash "
                                                          "vs chunked vs naive",
            "fused_fwd_bwd_ms": fused, "sdpa_flash_fwd_bwd_ms": sdpa, "chunked_fwd_bwd_ms": chunked,
            "fused_over_sdpa_flash": ratio(fused, sdpa, 4), "fused_over_chunked": ratio(fused, chunked, 4),
            "bf16_fwd_ms": bf16_fwd, "fp8_fwd_ms": fp8_fwd, "fp8_fwd_speedup": ratio(bf16_fwd, fp8_fwd, 4),
            "fused_extra_mem_bytes": fused_mem, "naive_extra_mem_bytes": naive_mem, "naive_basis": naive_basis,
            "fused_extra_mem_pct_of_naive": None if fused_mem is None else round(100 * fused_mem / naive_mem, 4),
        }
    return out


def _shapes(config: dict):
    """The ModelConfig and copy-head shape of a run's resolved config (a dict, as the run wrote it)."""
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.sizing.accounting import CopyHeadShape

    head = config["copy_head"]
    copy = (CopyHeadShape(head["heads"], head["head_dim"], head["qk_norm"], head.get("mixing", "gate"))
            if head["enabled"] else None)
    return ModelConfig(**config["model"]), copy


def memory_estimate_gib(config: dict, record: dict) -> float:
    """tools/model_info.py's per-GPU estimate for a run: its record's, or for a run stopped before writing one
    the same accounting.memory_estimate call on its config (one GPU: tp = pp = dp = 1)."""
    if record.get("memory_estimate_gib") is not None:
        return float(record["memory_estimate_gib"])
    from cplm_megatron.model.sizing.accounting import memory_estimate

    model, copy = _shapes(config)
    train = config["train"]
    attention = "sdpa" if model.attention_impl == "auto" else model.attention_impl  # no TE in the image
    est = memory_estimate(model, copy, tp=1, pp=1, dp=1, seq_len=train["seq_len"], micro_batch=train["micro_batch"],
                          param_bytes=4 if config["precision"]["dtype"] == "fp32" else 2,
                          recompute=config["recompute"]["granularity"], lm_head_loss=model.lm_head_loss,
                          attention=attention, document_masking=bool(config["data"].get("document_masking")))
    return est["total_gib"]


def _metrics(path: Path) -> list[dict]:
    """The trainer's per-step records (a copy of its metrics.jsonl, log_interval=1, read by the trainer's own
    reader: a line cut by a killed step is dropped) that carry a timestamp, by iteration."""
    from cplm_megatron.training.metrics_log import read_metrics

    records = [r for r in read_metrics(path) if "iteration" in r and "time" in r]
    return sorted(records, key=lambda r: r["iteration"])


def measured_step_time(records: list[dict], warmup: int, profiled: Optional[list] = None
                       ) -> tuple[Optional[float], int]:
    """Mean step time over the steps after the first `warmup` ones (and outside the `profiled` [first, last]
    iterations: the profiler slows them), and how many steps that is: from the trainer's per-interval step times
    (`step_time` over `interval_steps` steps), or for records without them the wall time between the log line of
    step `warmup` and the last one; (None, 0) without such steps."""
    first, last = profiled or (0, -1)
    later = [r for r in records if r["iteration"] > warmup and not first <= r["iteration"] <= last]
    if later and all("interval_steps" in r for r in later):
        steps = sum(r["interval_steps"] for r in later)
        return sum(r["step_time"] * r["interval_steps"] for r in later) / steps, steps
    start = [r for r in records if r["iteration"] <= warmup]
    if not start or records[-1]["iteration"] <= start[-1]["iteration"]:
        return None, 0
    first, last = start[-1], records[-1]
    steps = last["iteration"] - first["iteration"]
    return (last["time"] - first["time"]) / steps, steps


def train_flops(config: dict, record: dict) -> dict[str, float]:
    """Training FLOPs per token of a run, with attention at full T x T (the trainer's convention) and causal
    ((T+1)/2 keys per query): its record's, or for a run stopped before writing one, from its config."""
    if record.get("causal_flops_per_token") is not None:
        return {"full": record["flops_per_token"], "causal": record["causal_flops_per_token"]}
    from cplm_megatron.model.sizing.accounting import train_flops_figures

    model, copy = _shapes(config)
    flops = train_flops_figures(model, config["train"]["seq_len"], copy, config["recompute"]["granularity"])
    return {"full": flops["flops_per_token"], "causal": flops["causal_flops_per_token"]}


def run_figures(work: Path, name: str, warmup: int, device: Optional[str]) -> Optional[dict[str, Any]]:
    """One training run's figures from its config and per-step metrics (warm-up steps excluded), each named with
    its dtype, sequence length, micro batch, attention implementation and the LM-head loss path it resolved."""
    import yaml

    config_path = work / f"{name}.yaml"
    if not config_path.exists():  # the run never started (nor, maybe, the install: nothing of ours is importable)
        return None
    records = _metrics(work / f"{name}.metrics.jsonl")
    if not records:
        return None
    config = yaml.safe_load(config_path.read_text())
    record = _load(work / f"{name}.json") or {}
    train = config["train"]
    step_time, steps = measured_step_time(records, warmup, train.get("profile_steps"))
    tokens_per_sec = train["global_batch"] * train["seq_len"] / step_time if step_time else None
    peaks = [r["tflops_per_device"] / r["mfu"] for r in records if r.get("mfu") and r.get("tflops_per_device")]
    flops = train_flops(config, record)
    mfu = {kind: (flops[kind] * tokens_per_sec / 1e12 / peaks[-1] if tokens_per_sec and peaks else None)
           for kind in ("full", "causal")}
    estimate = memory_estimate_gib(config, record)
    return {
        "preset": config["model"].get("preset"), "device": record.get("device") or device,
        "dtype": config["precision"]["dtype"], "seq_len": train["seq_len"], "micro_batch": train["micro_batch"],
        "global_batch": train["global_batch"], "attention_impl": config["model"].get("attention_impl"),
        "lm_head_loss": record.get("lm_head_loss") or config["model"].get("lm_head_loss"),
        "copy_head": bool(config["copy_head"]["enabled"]),
        "iterations": records[-1]["iteration"], "warmup_steps_excluded": warmup, "measured_steps": steps,
        "step_time": step_time, "tokens_per_sec": tokens_per_sec,
        "train_flops_per_token_full": flops["full"], "train_flops_per_token_causal": flops["causal"],
        "peak_tflops": peaks[-1] if peaks else None,
        "mfu_full_attention": mfu["full"], "mfu_causal_attention": mfu["causal"],
        "peak_memory_gib": record.get("peak_memory_gib"),
        "record": "stopped early at its budget" if record.get("stopped_early") else (
            "complete" if record else "metrics.jsonl only (no trainer record)"),
        "memory_estimate_gib": round(estimate, 3),
        "peak_over_estimate": ratio(record.get("peak_memory_gib"), estimate, 4),
        "levers": {f"model.{k}": config["model"].get(k) for k in ("compile", "fused_swiglu")} | {
            "optimizer.fused": config["optimizer"].get("fused")},
        **profile_figures(_load(work / f"{name}.profile.json")),
    }


PROFILE_FIGURES = ("kernel_launches_per_step", "device_kernels_per_step", "device_kernel_us_per_step",
                   "matmul_share_of_kernel_time", "host_syncs_per_step", "compiled_regions_per_step", "mean_step_s")


def profile_figures(profile: Optional[dict]) -> dict[str, Any]:
    """A profiled run's per-step counts (training/profiling.py's profile.json) under `profile`, with its top three
    kernels; {} for a run that was not profiled."""
    if not profile:
        return {}
    top = [{k: row[k] for k in ("name", "us_per_step")} for row in profile.get("top_kernels", [])[:3]]
    return {"profile": {"iterations": profile.get("iterations"), **{k: profile.get(k) for k in PROFILE_FIGURES},
                        "top_kernels": top}}


def group_figures(work: Path, group: str, warmup: int, device: Optional[str] = None) -> dict[str, Any]:
    """Per slot: every run of the group that left figures, keyed by `TrainRun.key`, with each run's step time over
    the slot's `base_auto` run (the recipes' default) and, where both ran, the copy head's step-time overhead
    (`cplm_<loss>` against `base_<loss>`, the same loss path)."""
    out: dict[str, Any] = {}
    for run in group_runs(group):
        figures = run_figures(work, run_stem(group, run), warmup, device)
        if figures is not None:  # config.yaml names the path `auto` resolved to; the run definition what it asked
            out.setdefault(run.slot, {"title": SLOT_TITLES[run.slot]})[run.key] = {"lm_head_loss_asked": run.loss,
                                                                                     **figures}
    for entry in out.values():
        base = entry.get("base_auto", {}).get("step_time")
        for key, figures in list(entry.items()):
            if isinstance(figures, dict) and key != "base_auto":
                figures["step_time_over_base_auto"] = ratio(figures["step_time"], base, 4)
            if key.startswith("cplm_") and isinstance(figures, dict):
                over = ratio(figures["step_time"], (entry.get("base_" + key[5:]) or {}).get("step_time"), 4)
                entry[f"cplm_step_time_overhead_{key[5:]}"] = None if over is None else round(over - 1, 4)
    return out


def versus_peer(training: dict[str, Any], peers: dict[str, Any]) -> list[dict[str, Any]]:
    """Ours (each slot's `base_auto`, the recipes' default) beside the peer at the same shape: tokens/s and their
    ratio, eager and compiled."""
    rows = []
    variants = {k: v for peer in peers.values() if isinstance(peer, dict) for k, v in peer.get("variants", {}).items()}
    for slot, entry in training.items():
        ours = (entry.get("base_auto") or {}).get("tokens_per_sec")
        row = {"slot": slot, "title": SLOT_TITLES.get(slot, slot), "ours_tokens_per_sec": ours}
        for mode in ("eager", "compiled"):
            peer = variants.get(f"{slot}_{mode}", {}).get("tokens_per_sec")
            if peer is not None:
                row[f"peer_{mode}_tokens_per_sec"] = peer
                row[f"ours_over_peer_{mode}"] = ratio(ours, peer, 4)
        if len(row) > 3:
            rows.append(row)
    return rows


def step_status(rc: Optional[int], interrupted: bool = False) -> str:
    """A step's exit code in words (GNU timeout: 124 when its SIGTERM ended the step, 137 = SIGKILL)."""
    if interrupted:
        return "interrupted (the script ended during it)"
    if rc is None:
        return "not run"
    return {0: "ok", 124: "timed out (SIGTERM at its budget)", 137: "killed (SIGKILL)",
            75: "stopped early (resume code)", 143: "terminated (SIGTERM)"}.get(rc, f"failed (exit {rc})")


def read_steps(work: Path) -> list[dict[str, Any]]:
    """Every planned step in order with its status, exit code and seconds (steps.tsv rows as they ended)."""
    ran: dict[str, dict[str, Any]] = {}
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        name, budget, rc, seconds = parts
        interrupted = rc == "interrupted"
        code = None if interrupted else int(rc)
        ran[name] = {"name": name, "budget_s": int(budget), "rc": code, "seconds": int(seconds),
                     "status": step_status(code, interrupted)}
    plan = work / "plan.tsv"
    steps = []
    for line in plan.read_text().splitlines() if plan.exists() else []:
        name, budget = line.split("\t")
        steps.append(ran.pop(name, {"name": name, "budget_s": int(budget), "rc": None, "seconds": None,
                                    "status": step_status(None)}))
    return steps + list(ran.values())


# Steps that train a perf slot besides the whole matrix (perf_train): the lease's parts
PERF_SLOT_STEPS = {"small": "perf_small", "large_4k": "perf_large"}
# ours beside the peer: (our runs' step, the peer's step) pairs whose figures make a row
VERSUS_PEER_STEPS = (("train", "peer"), ("perf_small", "peer"), ("perf_train", "peer"), ("perf_train", "perf_peer"),
                     ("perf_large", "perf_peer"))


def figure_producers(path: str) -> list:
    """The steps whose output a figure of missing_figures' dotted path comes from, as alternatives (tuples of steps
    that together produce it)."""
    head, _, rest = path.partition(".")
    if head == "perf":
        slot = rest.split(".")[0]
        return [("perf_train",)] + ([(PERF_SLOT_STEPS[slot],)] if slot in PERF_SLOT_STEPS else [])
    if head in TRAIN_STEPS.values() or head in PEER_STEPS.values():
        return [(head,)]
    if head == "training":
        return [(TRAIN_STEPS["check"],)]
    if head == "versus_peer":
        return list(VERSUS_PEER_STEPS)
    return [({"copy_kernel": "kernel_bench"}.get(head, head),)]


def _run_missing(section: str, group: str, figures: dict[str, Any]) -> list[str]:
    """The dotted paths of a group's runs that are absent or have a null figure."""
    missing = []
    for run in group_runs(group):
        got = figures.get(run.slot, {}).get(run.key)
        if got is None:
            missing.append(f"{section}.{run.slot}.{run.key}")
            continue
        missing += [f"{section}.{run.slot}.{run.key}.{k}" for k, v in got.items()
                    if v is None and k != "step_time_over_base_auto"]
    return missing


def missing_figures(summary: dict, planned: Optional[set] = None) -> list[str]:
    """Dotted paths of the figures that are absent or null, of the planned steps only (a rerun of some steps
    misses nothing the others measure)."""
    missing = []
    if not summary["copy_kernel"]:
        missing.append("copy_kernel")
    for shape, figures in summary["copy_kernel"].items():
        missing += [f"copy_kernel.{shape}.{k}" for k, v in figures.items() if v is None]
    missing += _run_missing("training", "check", summary["training"])
    missing += _run_missing("perf", "perf", summary["perf"])
    for slot in ("small", "large_4k"):
        if summary["training"].get(slot, {}).get("cplm_step_time_overhead_auto") is None:
            missing.append(f"training.{slot}.cplm_step_time_overhead_auto")
    for group, step in PEER_STEPS.items():
        peer = summary["peer"].get(group) or {}
        if not peer.get("variants"):
            missing.append(step)
        missing += [f"{step}.{name}" for name, row in peer.get("variants", {}).items() if "error" in row]
    if not summary["versus_peer"]:
        missing.append("versus_peer")
    attention = summary["attention"] if isinstance(summary["attention"], dict) else {}
    if not attention.get("ratios"):
        missing.append("attention.ratios")
    for entry in attention.get("ratios", []):
        missing += [f"attention.seq{entry['seq']}.{entry.get('backend')}.{k}"
                    for k in ("time_vs_dense", "memory_vs_dense", "max_rel_err_vs_dense") if entry.get(k) is None]
    if not (summary["kernel_check"] or {}).get("passed"):
        missing.append("kernel_check.passed")
    if not (summary["compat"] or {}).get("ok"):
        missing.append("compat.ok")
    if not isinstance(summary["lm_head_loss"], dict):
        missing.append("lm_head_loss")
    if not isinstance(summary["study"], dict):
        missing.append("study")
    if planned is None:
        return missing
    return [m for m in missing if any(set(steps) <= planned for steps in figure_producers(m))]


def summarize(work: Path, dest: Path, dry_run: bool, budget_limit: int = GPU_BUDGET_S, warmup: int = 3) -> int:
    """Every figure the README's GPU table needs -> one summary.json (rewritten atomically: it is refreshed after
    every step); exit 1 if a step failed or a figure is missing."""
    steps = read_steps(work)
    lm_head = _load(work / "lm_head_loss.json")
    env = _load(work / "env.json")
    device = (env or {}).get("device")
    summary: dict[str, Any] = {
        "dry_run": dry_run,
        "note": "CPU dry run at tiny sizes: checks the script, NOT a measurement" if dry_run else "",
        "environment": env,
        "steps": steps,
        "budget_total_s": sum(s["budget_s"] for s in steps),
        "budget_limit_s": budget_limit,
        "wall_s": sum(s["seconds"] or 0 for s in steps),
        "compat": _load(work / "compat.json"),
        "kernel_check": _load(work / "kernel_check.json"),
        "copy_kernel": kernel_figures(_load(work / "copy_kernel.json")),
        "attention": _load(work / "attention.json") or "attention step failed: see its log",
        "flops_convention": FLOPS_CONVENTION,
        "training": group_figures(work, "check", warmup, device),
        "perf": group_figures(work, "perf", warmup, device),
        "peer": {group: _load(work / f"peer_{group}.json") for group in PEER_STEPS},
        "lm_head_loss": lm_head if lm_head is not None else "lm_head_loss step failed: see its log",
        "study": _load(work / "study.json") or "study step failed or did not run: see its log",
    }
    summary["versus_peer"] = versus_peer({**summary["perf"], **summary["training"]}, summary["peer"])
    summary["missing"] = missing_figures(summary, {s["name"] for s in steps})
    summary["summary_imported_torch"] = "torch" in sys.modules  # it must not: it runs from the EXIT trap
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(dest)
    failed = [s["name"] for s in steps if s["rc"] != 0 and s["name"] != "summary"]
    print(f"[summary] {dest}: {len(steps)} steps, failed: {failed or 'none'}; missing figures: "
          f"{summary['missing'] or 'none'}; budgets {summary['budget_total_s']} s of {budget_limit}")
    return 1 if failed or summary["missing"] else 0


def read_lease(out: Path) -> dict[str, Any]:
    """The lease's plan and events (lease.tsv rows: plan/start/end/skip/signal/done) per part."""
    parts: dict[str, dict[str, Any]] = {}
    events: dict[str, Any] = {"signal": None, "done": False}
    path = out / "lease.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        kind, name, value, seconds = (line.split("\t") + ["", "", ""])[:4]
        if kind == "plan":
            parts[name] = {"name": name, "steps": value.split(","), "status": "not run", "seconds": None}
        elif kind == "start" and name in parts:
            parts[name].update(status="running", limit_s=int(value), started_at_s=int(seconds))
        elif kind == "end" and name in parts:
            code = int(value)
            parts[name].update(rc=code, seconds=int(seconds), status="ok" if code == 0 else
                               "stopped by its timeout" if code in (124, 137) else f"ended with exit {code}")
        elif kind == "skip" and name in parts:
            parts[name]["status"] = f"skipped: {value} s left"
        elif kind == "signal":
            events["signal"] = {"signal": name, "during": None if value == "-" else value, "at_s": int(seconds)}
        elif kind == "done":
            events["done"] = True
    return {"parts": parts, **events}


def lease_headline(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of a finished (or cut) part that decide, from its summary.json."""
    if name == "kernel":
        return {"kernel_check_passed": (summary.get("kernel_check") or {}).get("passed"),
                **{shape: {k: v.get(k) for k in ("fused_over_sdpa_flash", "fused_over_chunked", "fp8_fwd_speedup")}
                   for shape, v in summary.get("copy_kernel", {}).items()}}
    if name in ("perf", "large", "compat_train"):
        section = summary.get("training", {}) if name == "compat_train" else summary.get("perf", {})
        runs = {f"{slot}.{key}": {k: run.get(k) for k in ("tokens_per_sec", "mfu_causal_attention",
                                                            "step_time_over_base_auto", "peak_memory_gib",
                                                            "micro_batch", "lm_head_loss")}
                for slot, entry in section.items() for key, run in entry.items() if isinstance(run, dict)}
        return {"runs": runs, "versus_peer": summary.get("versus_peer", [])}
    if name == "study" and isinstance(summary.get("study"), dict):
        study = summary["study"]
        arms = {arm: {"tokens": (a.get("train") or {}).get("tokens"), "val_loss": a.get("val_loss"),
                      "copy_accuracy": a.get("copy_accuracy"),
                      "last_probe": (a.get("probes") or [None])[-1]} for arm, a in study.get("arms", {}).items()}
        return {"complete": study.get("complete"), "equal_tokens": study.get("equal_tokens"), "arms": arms,
                "comparisons": study.get("comparisons"), "controls": study.get("controls")}
    if name == "peer_loss":
        return {"peer": summary.get("peer", {}).get("perf"), "lm_head_loss": summary.get("lm_head_loss")}
    return {}


def lease_summary(out: Path, command: str, limit: int, dry_run: bool) -> int:
    """OUT/lease_summary.json: every part of the lease with its status and its steps' statuses, where the lease
    stopped (a part still `running` in a lease that is over: killed there) and each part's headline figures."""
    lease = read_lease(out)
    parts = list(lease["parts"].values())
    for index, part in enumerate(parts):
        folder = out / f"{index}_{part['name']}"
        summary = _load(folder / "summary.json") or {}
        part["folder"] = folder.name
        part["summary"] = "summary.json" if summary else None
        part["steps"] = [{"name": s["name"], "status": s["status"], "seconds": s["seconds"]}
                         for s in summary.get("steps", [])]
        part["missing"] = summary.get("missing")
        part["headline"] = lease_headline(part["name"], summary) if summary else {}
    running = [p["name"] for p in parts if p["status"] == "running"]
    signal_info = lease["signal"]
    stopped = (signal_info or {}).get("during") or (running[0] if running else None)
    for part in parts:
        if part["status"] == "running" and signal_info:
            part["status"] = f"interrupted ({signal_info['signal']} to the lease)"
    record = {
        "dry_run": dry_run, "command": command, "limit_s": limit,
        "note": "CPU dry run at tiny sizes: checks the script, NOT a measurement" if dry_run else "",
        "complete": lease["done"] and all(p["status"] == "ok" for p in parts),
        "finished": lease["done"],
        "stopped_in": stopped,
        "where": ("finished" if lease["done"] else
                  f"stopped by {signal_info['signal']} during {stopped}" if signal_info else
                  f"running {stopped} (if this file is the last word, the lease was killed there)" if stopped else
                  "between parts"),
        "parts": parts,
    }
    dest = out / "lease_summary.json"
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(dest)
    print(f"[lease-summary] {dest}: " + ", ".join(f"{p['name']} {p['status']}" for p in parts) + f"; {record['where']}")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["install-check", "compat", "summary", "lease-summary"])
    p.add_argument("work", type=Path, help="the run's working directory (lease-summary: the lease's OUT)")
    p.add_argument("dest", type=Path, nargs="?", help="summary: where to write summary.json")
    p.add_argument("--dry-run", action="store_true", help="summary: label it a CPU dry run")
    p.add_argument("--budget-limit", type=int, default=GPU_BUDGET_S, help="summary: the script's budget limit (s)")
    p.add_argument("--warmup-steps", type=int, default=3, help="summary: training steps left out of the timing")
    p.add_argument("--command", default="first", help="lease-summary: which command of the lease")
    p.add_argument("--limit", type=int, default=570, help="lease-summary: the command's limit (s)")
    args = p.parse_args(argv)
    if args.what == "lease-summary":
        return lease_summary(args.work, args.command, args.limit, args.dry_run)
    if args.what == "install-check":
        return install_check(args.work)
    if args.what == "compat":
        return check_compat(args.work)
    if args.dest is None:
        p.error("summary needs DEST")
    return summarize(args.work, args.dest, args.dry_run, args.budget_limit, args.warmup_steps)


if __name__ == "__main__":
    sys.exit(main())
