"""The Python steps of benchmarks/gpu/run_gpu_checks.sh: environment record, compat-layer scope check,
and the summary that turns every step's raw output into the figures of the README's GPU table.

    python benchmarks/gpu/gpu_steps.py env     WORK_DIR
    python benchmarks/gpu/gpu_steps.py compat  WORK_DIR
    python benchmarks/gpu/gpu_steps.py summary WORK_DIR SUMMARY_JSON [--dry-run]

WORK_DIR holds the steps' files: steps.tsv (name, budget, exit code, seconds), env.json, compat.json,
kernel_check.json, copy_kernel.json, train_<slot>_<variant>.json + .yaml (the trainer's summary.json and
resolved config), lm_head_loss.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

GPU_BUDGET_S = 540  # the whole script must end within 9 minutes of one 15-minute lease
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
    return json.loads(path.read_text()) if path.exists() else None


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
    copy = CopyHeadShape(head["heads"], head["head_dim"], head["qk_norm"]) if head["enabled"] else None
    train = config["train"]
    est = memory_estimate(model, copy, tp=1, pp=1, dp=1, seq_len=train["seq_len"], micro_batch=train["micro_batch"],
                          param_bytes=4 if config["precision"]["dtype"] == "fp32" else 2,
                          recompute=config["recompute"]["granularity"])
    return est["total_gib"]


def training_figures(work: Path) -> dict[str, Any]:
    """Per slot: tokens/s, MFU, step time and peak memory of baseline and CPLM, the CPLM step-time overhead,
    and peak memory over model_info's estimate."""
    import yaml

    out: dict[str, Any] = {}
    for slot in TRAIN_SLOTS:
        entry: dict[str, Any] = {}
        for variant in ("base", "cplm"):
            record = _load(work / f"train_{slot}_{variant}.json")
            config_path = work / f"train_{slot}_{variant}.yaml"
            if record is None or not config_path.exists():
                continue
            estimate = memory_estimate_gib(yaml.safe_load(config_path.read_text()))
            entry[variant] = {key: record.get(key) for key in ("preset", "device", "seq_len", "global_batch",
                                                                "iterations", "tokens_per_sec", "mfu", "step_time",
                                                                "tflops_per_device", "peak_memory_gib")}
            entry[variant]["memory_estimate_gib"] = round(estimate, 3)
            entry[variant]["peak_over_estimate"] = _ratio(record.get("peak_memory_gib"), estimate)
        if "base" in entry and "cplm" in entry:
            ratio = _ratio(entry["cplm"]["step_time"], entry["base"]["step_time"])
            entry["cplm_step_time_overhead"] = None if ratio is None else round(ratio - 1, 4)
        out[slot] = entry
    return out


def read_steps(work: Path) -> list[dict[str, Any]]:
    steps = []
    path = work / "steps.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, budget, rc, seconds = line.split("\t")
        steps.append({"name": name, "budget_s": int(budget), "rc": int(rc), "seconds": int(seconds)})
    return steps


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
    if not (summary["kernel_check"] or {}).get("passed"):
        missing.append("kernel_check.passed")
    if not (summary["compat"] or {}).get("ok"):
        missing.append("compat.ok")
    return missing


def summarize(work: Path, dest: Path, dry_run: bool) -> int:
    """Every figure the README's GPU table needs -> one summary.json; exit 1 if a step failed or one is missing."""
    steps = read_steps(work)
    lm_head = _load(work / "lm_head_loss.json")
    summary: dict[str, Any] = {
        "dry_run": dry_run,
        "note": "CPU dry run at tiny sizes: checks the script, NOT a measurement" if dry_run else "",
        "environment": _load(work / "env.json"),
        "steps": steps,
        "budget_total_s": sum(s["budget_s"] for s in steps),
        "budget_limit_s": GPU_BUDGET_S,
        "wall_s": sum(s["seconds"] for s in steps),
        "compat": _load(work / "compat.json"),
        "kernel_check": _load(work / "kernel_check.json"),
        "copy_kernel": kernel_figures(_load(work / "copy_kernel.json")),
        "training": training_figures(work),
        "lm_head_loss": lm_head if lm_head is not None else "lm_head_loss step failed: see its log",
    }
    summary["missing"] = missing_figures(summary)
    dest.write_text(json.dumps(summary, indent=2))
    failed = [s["name"] for s in steps if s["rc"] != 0]
    print(f"[summary] {dest}: {len(steps)} steps, failed: {failed or 'none'}; missing figures: "
          f"{summary['missing'] or 'none'}; budgets {summary['budget_total_s']} s of {GPU_BUDGET_S}")
    return 1 if failed or summary["missing"] else 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["env", "compat", "summary"])
    p.add_argument("work", type=Path, help="the run's working directory")
    p.add_argument("dest", type=Path, nargs="?", help="summary: where to write summary.json")
    p.add_argument("--dry-run", action="store_true", help="summary: label it a CPU dry run")
    args = p.parse_args(argv)
    if args.what == "env":
        record_env(args.work)
        return 0
    if args.what == "compat":
        return check_compat(args.work)
    if args.dest is None:
        p.error("summary needs DEST")
    return summarize(args.work, args.dest, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
