#!/usr/bin/env python
"""Parameter counts, FLOPs per token and a per-GPU memory estimate for a model preset and layout;
which layouts fit a GPU's memory.

The model is built for real as a Megatron-Core GPTModel on the meta device (no memory is allocated,
even for 13B) and its parameter count is checked against the analytic formula. The memory estimate
counts the LM head's loss per `--lm-head-loss` (Megatron's logits, or one tile) and the optimizer
states left on the GPU with `--offload-fraction`; `--gpu-memory 80GB` says whether the layout fits,
and `--plan` lists the layouts of `--gpus` GPUs that fit, least costly first. `--attention` follows
`model.attention_impl` (sdpa/te: flash, no T x T activations; megatron: the unfused one's probabilities).

  python tools/model_info.py --preset smollm2-1.7b --tp 2 --pp 1 --dp 8 --seq-len 2048 --micro-batch 4
  python tools/model_info.py --preset llama-13b --gpu-memory 80GB --plan --gpus 8 --seq-len 4096
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Dict, List, Optional

from cplm_megatron.cli import exit_2_on, quiet_known_warnings
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.accounting import (
    GIB,
    CopyHeadShape,
    backbone_params,
    copy_head_params,
    lm_head_loss_bytes,
    memory_estimate,
    model_summary,
    plan_layouts,
)
from cplm_megatron.model.config import ModelConfig, available_presets, load_preset


def count_built_params(model: ModelConfig, copy: Optional[CopyHeadShape]) -> Dict[str, int]:
    """Build the full model (TP=PP=1) on the meta device and count its parameters."""
    import torch

    from cplm_megatron.model.builder import build_model
    from cplm_megatron.model.copy_head import CopyHeadConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig

    parallel = ParallelConfig()
    init_distributed(parallel, model)
    head_cfg = CopyHeadConfig(enabled=copy is not None, **({} if copy is None else
                              dict(heads=copy.heads, head_dim=copy.head_dim, qk_norm=copy.qk_norm)))
    with torch.device("meta"):
        [chunk] = build_model(model, head_cfg, parallel)
    head = sum(p.numel() for n, p in chunk.named_parameters() if n.startswith("copy_head."))
    total = sum(p.numel() for p in chunk.parameters())
    return {"backbone": total - head, "copy_head": head, "total": total}


def _fmt(n: float) -> str:
    return f"{n:,.0f}"


_UNITS = {"": 1e9, "gb": 1e9, "g": 1e9, "gib": 2**30, "mb": 1e6, "mib": 2**20, "tb": 1e12, "tib": 2**40}


def parse_memory(text: str) -> float:
    """'80GB' (decimal, 10^9 bytes: conservative, an "80GB" H100 holds 85.5e9), '80GiB', '141GB' -> GiB."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"--gpu-memory {text!r}: expected a size like 80GB, 80GiB or 141GB")
    return float(match.group(1)) * _UNITS[match.group(2).lower()] / GIB


def report(args: argparse.Namespace) -> Dict[str, object]:
    """Everything model_info prints, as a dict."""
    model = load_preset(args.preset)
    copy = None if args.no_copy_head else CopyHeadShape(args.copy_heads, args.copy_head_dim, args.copy_qk_norm)
    summary = model_summary(model, copy, args.seq_len)
    built = count_built_params(model, copy)
    if built["backbone"] != backbone_params(model) or built["copy_head"] != copy_head_params(model, copy):
        raise SystemExit(f"parameter count mismatch: built {built} vs analytic {summary}")
    summary["built_on_meta_device"] = built
    summary["layout"] = dict(tp=args.tp, pp=args.pp, cp=args.cp, dp=args.dp, sp=args.sp, seq_len=args.seq_len,
                             micro_batch=args.micro_batch, recompute=args.recompute, dtype=args.dtype,
                             lm_head_loss=args.lm_head_loss, offload_fraction=args.offload_fraction,
                             attention=args.attention, document_masking=args.document_masking)
    param_bytes = 4 if args.dtype == "fp32" else 2
    summary["memory_per_gpu"] = mem = memory_estimate(
        model, copy, tp=args.tp, pp=args.pp, dp=args.dp, seq_len=args.seq_len, micro_batch=args.micro_batch,
        sp=args.sp, param_bytes=param_bytes, recompute=args.recompute, lm_head_loss=args.lm_head_loss,
        offload_fraction=args.offload_fraction, attention=args.attention, document_masking=args.document_masking,
        cp=args.cp,
    )
    tokens = args.seq_len * args.micro_batch
    summary["lm_head_loss_per_micro_batch_gib"] = {
        impl: {k: v / GIB for k, v in lm_head_loss_bytes(model, tokens, args.tp, impl, param_bytes).items()}
        for impl in ("megatron", "chunked", "fused")
    }
    if args.gpu_memory is not None:
        usable = args.gpu_memory * (1 - args.reserve)
        total = mem["total_distributed_optimizer_gib"]
        summary["fit"] = {"gpu_memory_gib": args.gpu_memory, "usable_gib": usable, "total_gib": total,
                          "fits": total <= usable}
        if args.plan:
            rows = plan_layouts(model, copy, args.gpus, args.seq_len, args.micro_batch, usable, param_bytes,
                                args.attention, args.document_masking)
            summary["plan"] = {"gpus": args.gpus, "usable_gib": usable, "fitting": [r for r in rows if r["fits"]],
                               "considered": len(rows)}
    return summary


def print_table(s: Dict[str, object]) -> None:
    """Human-readable summary."""
    f = s["forward_flops_per_token"]
    mem = s["memory_per_gpu"]
    lay = s["layout"]
    rows = [
        ("preset", s["preset"]),
        ("backbone parameters", _fmt(s["backbone_params"])),
        ("copy-head parameters", _fmt(s["copy_head_params"])),
        ("total parameters", _fmt(s["total_params"])),
        (f"train FLOPs/token (seq {s['seq_len']})", f"{s['train_flops_per_token']:.4e}"),
        ("  of which copy head", f"{3 * f['copy_head']:.4e} "
         f"({100 * 3 * f['copy_head'] / s['train_flops_per_token']:.2f}%)"),
        ("  backbone-only train FLOPs/token", f"{s['train_flops_per_token_backbone_only']:.4e}"),
        ("layout", f"tp={lay['tp']} pp={lay['pp']} cp={lay['cp']} dp={lay['dp']} sp={lay['sp']} "
                   f"micro_batch={lay['micro_batch']}"),
        ("params per GPU (largest stage)", _fmt(mem["params_per_gpu"])),
        ("weights / grads (GiB)", f"{mem['weights_gib']:.2f} / {mem['grads_gib']:.2f}"),
        ("optimizer states (GiB)", f"{mem['optimizer_gib']:.2f} (distributed optimizer: "
         f"{mem['optimizer_distributed_gib']:.2f}"
         + (f", {mem['optimizer_host_gib']:.2f} offloaded to host memory)" if lay["offload_fraction"] else ")")),
        ("activations (GiB)", f"{mem['activations_gib']:.2f} (stage: {mem['busiest_stage']})"),
        (f"  of which attention ({lay['attention']})", f"{mem['attention_held_gib']:.2f} held, "
         f"{mem['attention_peak_gib']:.2f} one layer's peak"),
        ("LM-head loss, 1 micro-batch (GiB)", "  ".join(
            f"{impl} {v['peak']:.3f}" + (" <-" if impl == lay["lm_head_loss"] else "")
            for impl, v in s["lm_head_loss_per_micro_batch_gib"].items())),
        ("total per GPU (GiB)", f"{mem['total_gib']:.2f} (distributed optimizer: "
         f"{mem['total_distributed_optimizer_gib']:.2f})"),
        ("assumptions", mem["assumptions"]),
    ]
    if "fit" in s:
        fit = s["fit"]
        rows.append((f"fits {fit['gpu_memory_gib']:.1f} GiB GPUs", f"{'yes' if fit['fits'] else 'NO'}: "
                     f"{fit['total_gib']:.2f} of {fit['usable_gib']:.2f} GiB usable (distributed optimizer)"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    if "plan" in s:
        print_plan(s["plan"])


def print_plan(plan: Dict[str, object], limit: int = 8) -> None:
    """The fitting layouts, least costly first (no offload first, then fewest extra FLOPs)."""
    fitting = plan["fitting"]
    print(f"\nlayouts of {plan['gpus']} GPUs that fit in {plan['usable_gib']:.1f} GiB: {len(fitting)} of "
          f"{plan['considered']} (distributed optimizer; SP with TP)")
    if not fitting:
        print("  none: more GPUs (pipeline stages), a shorter sequence or a smaller micro-batch")
        return
    print(f"  {'tp':>2} {'pp':>2} {'cp':>2} {'dp':>2}  {'recompute':<9}  {'lm_head_loss':<12}  {'offload':>7}  "
          f"{'GiB/GPU':>7}  {'+FLOPs':>6}")
    for r in fitting[:limit]:
        print(f"  {r['tp']:>2} {r['pp']:>2} {r['cp']:>2} {r['dp']:>2}  {r['recompute']:<9}  {r['lm_head_loss']:<12}  "
              f"{r['offload_fraction']:>7.1f}  {r['total_gib']:>7.2f}  {r['extra_flops_pct']:>5.1f}%")


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (sizes, counts and parallel degrees)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=available_presets())
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--tp", type=positive_int, default=1)
    p.add_argument("--pp", type=positive_int, default=1)
    p.add_argument("--cp", type=positive_int, default=1, help="context parallelism: the sequence split over --cp GPUs")
    p.add_argument("--dp", type=positive_int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (shards norm/dropout activations)")
    p.add_argument("--seq-len", type=positive_int, default=2048)
    p.add_argument("--micro-batch", type=positive_int, default=1)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--lm-head-loss", choices=["megatron", "chunked", "fused"], default="megatron",
                   help="model.lm_head_loss: Megatron's logits, or the loss over tiles (no logits tensor)")
    p.add_argument("--attention", choices=["sdpa", "te", "megatron"], default="sdpa",
                   help="model.attention_impl as resolved: sdpa/te (flash) or megatron (unfused, [b,heads,s,s])")
    p.add_argument("--document-masking", action="store_true",
                   help="data.document_masking: the step's [b,1,s,s] mask (and SDPA's bias) per micro-batch")
    p.add_argument("--offload-fraction", type=float, default=0.0,
                   help="optimizer.offload_fraction: share of the distributed optimizer's states on the CPU")
    p.add_argument("--gpu-memory", type=parse_memory, help="GPU memory, e.g. 80GB (decimal) or 80GiB: does it fit?")
    p.add_argument("--reserve", type=float, default=0.1,
                   help="fraction of --gpu-memory kept free for the CUDA context, NCCL and fragmentation")
    p.add_argument("--plan", action="store_true", help="with --gpu-memory: list the layouts of --gpus GPUs that fit")
    p.add_argument("--gpus", type=positive_int, default=8, help="GPUs for --plan (default: one 8-GPU node)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--no-copy-head", action="store_true", help="report the plain backbone")
    p.add_argument("--copy-heads", type=positive_int, default=4)
    p.add_argument("--copy-head-dim", type=positive_int, default=64)
    p.add_argument("--copy-qk-norm", action="store_true")
    return p.parse_args(argv)


@exit_2_on(ConfigError)
def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    args = parse_args(argv)
    from cplm_megatron.model.layout import validate_layout
    from cplm_megatron.parallel.distributed import ParallelConfig

    if args.plan and args.gpu_memory is None:
        raise ConfigError("--plan needs --gpu-memory (e.g. --gpu-memory 80GB)")
    if not 0.0 <= args.offload_fraction <= 1.0 or not 0.0 <= args.reserve < 1.0:
        raise ConfigError("--offload-fraction must be in [0, 1] and --reserve in [0, 1)")
    validate_layout(args.tp * args.pp * args.cp * args.dp,
                    ParallelConfig(tp=args.tp, pp=args.pp, sp=args.sp, cp=args.cp), load_preset(args.preset))
    if args.cp > 1 and args.seq_len % (2 * args.cp):
        raise ConfigError(f"--seq-len {args.seq_len} is not divisible by 2 x --cp = {2 * args.cp}")
    summary = report(args)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
