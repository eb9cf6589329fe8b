"""The Python steps of benchmarks/gpu/run_gpu_checks.sh: environment record, compat-layer scope check,
and the summary that turns every step's raw output into the figures of the README's GPU table.

    python benchmarks/gpu/gpu_steps.py env     WORK_DIR
    python benchmarks/gpu/gpu_steps.py compat  WORK_DIR
    python benchmarks/gpu/gpu_steps.py summary WORK_DIR SUMMARY_JSON [--dry-run] [--budget-limit S]

WORK_DIR holds the steps' files: plan.tsv (the planned steps and budgets, in order), steps.tsv (name, budget,
exit code or "interrupted", seconds; one row as each step ends), env.json, compat.json, kernel_check.json,
copy_kernel.json, train_<slot>_<variant>.json + .yaml + .metrics.jsonl (the trainer's summary.json, or
summary_stopped_early.json when its budget stopped it, resolved config and per-step metrics),
lm_head_loss.json. The summary runs after every step and from the script's EXIT trap, so it imports no torch
(the memory estimate of Megatron's LM-head path is torch-free) and reads partial files as they are.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

GPU_BUDGET_S = 360  # one pass + a machine start leave the 4 minutes a second start needs in a 15-minute lease
TRAIN_SLOTS = ("small", "large")  # GPU: SmolLM2-135M and 1.7B; dry run: the tiny preset twice


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def record_env(work: Path) -> None:
    """Versions and device of this run -> env.json."""
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            **{dist: _version(dist) for dist in ("triton", "megatron-core", "transformer-engine", "transformers")}}
    (work / "env.json").write_text(json.dumps(info, indent=2))
    print(json.dumps(info))


def check_compat(work: Path) -> int:
    """The compat layer's scope on this machine: on CUDA no CPU patch may apply; without Apex/TE every
    torch-fallback fix this megatron-core needs does. -> compat.json; exit 1 if either fails."""
    import torch

    from cplm_megatron.parallel.cpu_compat import PATCHES, apex_or_te_present, apply_compat, describe_compat

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


def _ok_row(rows: list[dict], **key) -> Optional[dict]:
    for row in rows:
        if row["status"] == "ok" and all(row[k] == v for k, v in key.items()):
            return row
    return None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 4) if a is not None and b else None


def _field(rows: list[dict], field: str, impl: str, T: int, d: int, mode: str, dtype: str = "bf16") -> Optional[float]:
    row = _ok_row(rows, impl=impl, T=T, d=d, mode=mode, dtype=dtype)
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
        out[f"T={T},d={d}"] = {
            "fused_fwd_bwd_ms": fused, "sdpa_flash_fwd_bwd_ms": sdpa, "chunked_fwd_bwd_ms": chunked,
            "fused_over_sdpa_flash": _ratio(fused, sdpa), "fused_over_chunked": _ratio(fused, chunked),
            "bf16_fwd_ms": bf16_fwd, "fp8_fwd_ms": fp8_fwd, "fp8_fwd_speedup": _ratio(bf16_fwd, fp8_fwd),
            "fused_extra_mem_bytes": fused_mem, "naive_extra_mem_bytes": naive_mem, "naive_basis": naive_basis,
            "fused_extra_mem_pct_of_naive": None if fused_mem is None else round(100 * fused_mem / naive_mem, 4),
        }
    return out


def memory_estimate_gib(config: dict) -> float:
    """tools/model_info.py's per-GPU estimate (the same accounting.memory_estimate call) for a run's config."""
    from cplm_megatron.model.accounting import CopyHeadShape, memory_estimate
    from cplm_megatron.model.config import ModelConfig

    model = ModelConfig(**config["model"])
    head = config["copy_head"]
    copy = (CopyHeadShape(head["heads"], head["head_dim"], head["qk_norm"], head.get("mixing", "gate"))
            if head["enabled"] else None)
    train = config["train"]
    attention = "sdpa" if model.attention_impl == "auto" else model.attention_impl  # no TE in the image
    est = memory_estimate(model, copy, tp=1, pp=1, dp=1, seq_len=train["seq_len"], micro_batch=train["micro_batch"],
                          param_bytes=4 if config["precision"]["dtype"] == "fp32" else 2,
                          recompute=config["recompute"]["granularity"], lm_head_loss=model.lm_head_loss,
                          attention=attention, document_masking=bool(config["data"].get("document_masking")))
    return est["total_gib"]


def _from_metrics(path: Path) -> Optional[dict]:
    """A throughput record from the trainer's per-step metrics (a run killed before it wrote one): the last
    logged step's tokens/s, MFU and step time."""
    if not path.exists():
        return None
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "tokens_per_sec" in record:
            records.append(record)
    if not records:
        return None
    last = records[-1]
    return {"iterations": last.get("iteration"), "tokens_per_sec": last.get("tokens_per_sec"), "mfu": last.get("mfu"),
            "step_time": last.get("step_time"), "tflops_per_device": last.get("tflops_per_device"),
            "peak_memory_gib": last.get("peak_memory_gib"), "source": "metrics.jsonl (no summary record)"}


def training_figures(work: Path) -> dict[str, Any]:
    """Per slot: tokens/s, MFU, step time and peak memory of baseline and CPLM, the CPLM step-time overhead,
    and peak memory over model_info's estimate."""
    import yaml

    out: dict[str, Any] = {}
    for slot in TRAIN_SLOTS:
        entry: dict[str, Any] = {}
        for variant in ("base", "cplm"):
            name = f"train_{slot}_{variant}"
            record = _load(work / f"{name}.json") or _from_metrics(work / f"{name}.metrics.jsonl")
            config_path = work / f"{name}.yaml"
            if record is None or not config_path.exists():
                continue
            config = yaml.safe_load(config_path.read_text())
            record.setdefault("preset", config["model"].get("preset"))
            record.setdefault("seq_len", config["train"]["seq_len"])
            record.setdefault("global_batch", config["train"]["global_batch"])
            estimate = memory_estimate_gib(config)
            entry[variant] = {key: record.get(key) for key in ("preset", "device", "seq_len", "global_batch",
                                                                "iterations", "tokens_per_sec", "mfu", "step_time",
                                                                "tflops_per_device", "peak_memory_gib")}
            entry[variant]["micro_batch"] = config["train"]["micro_batch"]
            entry[variant]["attention_impl"] = config["model"].get("attention_impl")
            entry[variant]["dtype"] = config["precision"]["dtype"]
            entry[variant]["record"] = record.get("source") or (
                "stopped early at its budget" if record.get("stopped_early") else "complete")
            entry[variant]["memory_estimate_gib"] = round(estimate, 3)
            entry[variant]["peak_over_estimate"] = _ratio(record.get("peak_memory_gib"), estimate)
        if "base" in entry and "cplm" in entry:
            ratio = _ratio(entry["cplm"]["step_time"], entry["base"]["step_time"])
            entry["cplm_step_time_overhead"] = None if ratio is None else round(ratio - 1, 4)
        out[slot] = entry
    return out


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


def missing_figures(summary: dict) -> list[str]:
    """Dotted paths of the GPU table's figures that are absent or null."""
    missing = []
    if not summary["copy_kernel"]:
        missing.append("copy_kernel")
    for shape, figures in summary["copy_kernel"].items():
        missing += [f"copy_kernel.{shape}.{k}" for k, v in figures.items() if v is None]
    for slot in TRAIN_SLOTS:
        entry = summary["training"].get(slot, {})
        for variant in ("base", "cplm"):
            if variant not in entry:
                missing.append(f"training.{slot}.{variant}")
                continue
            missing += [f"training.{slot}.{variant}.{k}" for k, v in entry[variant].items() if v is None]
        if entry.get("cplm_step_time_overhead") is None:
            missing.append(f"training.{slot}.cplm_step_time_overhead")
    attention = summary["attention"] if isinstance(summary["attention"], dict) else {}
    if not attention.get("ratios"):
        missing.append("attention.ratios")
    for entry in attention.get("ratios", []):
        missing += [f"attention.seq{entry['seq']}.{k}" for k in ("time_vs_dense", "memory_vs_dense", "max_rel_err_vs_dense")
                    if entry.get(k) is None]
    if not (summary["kernel_check"] or {}).get("passed"):
        missing.append("kernel_check.passed")
    if not (summary["compat"] or {}).get("ok"):
        missing.append("compat.ok")
    return missing


def summarize(work: Path, dest: Path, dry_run: bool, budget_limit: int = GPU_BUDGET_S) -> int:
    """Every figure the README's GPU table needs -> one summary.json (rewritten atomically: it is refreshed after
    every step); exit 1 if a step failed or a figure is missing."""
    steps = read_steps(work)
    lm_head = _load(work / "lm_head_loss.json")
    summary: dict[str, Any] = {
        "dry_run": dry_run,
        "note": "CPU dry run at tiny sizes: checks the script, NOT a measurement" if dry_run else "",
        "environment": _load(work / "env.json"),
        "steps": steps,
        "budget_total_s": sum(s["budget_s"] for s in steps),
        "budget_limit_s": budget_limit,
        "wall_s": sum(s["seconds"] or 0 for s in steps),
        "compat": _load(work / "compat.json"),
        "kernel_check": _load(work / "kernel_check.json"),
        "copy_kernel": kernel_figures(_load(work / "copy_kernel.json")),
        "attention": _load(work / "attention.json") or "attention step failed: see its log",
        "training": training_figures(work),
        "lm_head_loss": lm_head if lm_head is not None else "lm_head_loss step failed: see its log",
    }
    summary["missing"] = missing_figures(summary)
    summary["summary_imported_torch"] = "torch" in sys.modules  # it must not: it runs from the EXIT trap
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(dest)
    failed = [s["name"] for s in steps if s["rc"] != 0 and s["name"] != "summary"]
    print(f"[summary] {dest}: {len(steps)} steps, failed: {failed or 'none'}; missing figures: "
          f"{summary['missing'] or 'none'}; budgets {summary['budget_total_s']} s of {budget_limit}")
    return 1 if failed or summary["missing"] else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["env", "compat", "summary"])
    p.add_argument("work", type=Path, help="the run's working directory")
    p.add_argument("dest", type=Path, nargs="?", help="summary: where to write summary.json")
    p.add_argument("--dry-run", action="store_true", help="summary: label it a CPU dry run")
    p.add_argument("--budget-limit", type=int, default=GPU_BUDGET_S, help="summary: the script's budget limit (s)")
    args = p.parse_args(argv)
    if args.what == "env":
        record_env(args.work)
        return 0
    if args.what == "compat":
        return check_compat(args.work)
    if args.dest is None:
        p.error("summary needs DEST")
    return summarize(args.work, args.dest, args.dry_run, args.budget_limit)


if __name__ == "__main__":
    sys.exit(main())
