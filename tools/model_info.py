#!/usr/bin/env python
"""Parameter counts, FLOPs per token and a per-GPU memory estimate for a model preset and layout.

The model is built for real as a Megatron-Core GPTModel on the meta device (no memory is allocated,
even for 13B) and its parameter count is checked against the analytic formula.

  python tools/model_info.py --preset smollm2-1.7b --tp 2 --pp 1 --dp 8 --seq-len 2048 --micro-batch 4
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional

from cplm_megatron.cli import quiet_known_warnings
from cplm_megatron.model.accounting import (
    CopyHeadShape,
    backbone_params,
    copy_head_params,
    memory_estimate,
    model_summary,
)
from cplm_megatron.model.config import ModelConfig, available_presets, load_preset


def count_built_params(model: ModelConfig, copy: Optional[CopyHeadShape]) -> Dict[str, int]:
    """Build the full model (TP=PP=1) on the meta device and count its parameters."""
    import torch

    from cplm_megatron.model.builder import build_model
    from cplm_megatron.model.copy_head import CopyHeadConfig
    from cplm_megatron.parallel.distributed import ParallelConfig, init_distributed

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


def report(args: argparse.Namespace) -> Dict[str, object]:
    """Everything model_info prints, as a dict."""
    model = load_preset(args.preset)
    copy = None if args.no_copy_head else CopyHeadShape(args.copy_heads, args.copy_head_dim, args.copy_qk_norm)
    summary = model_summary(model, copy, args.seq_len)
    built = count_built_params(model, copy)
    if built["backbone"] != backbone_params(model) or built["copy_head"] != copy_head_params(model, copy):
        raise SystemExit(f"parameter count mismatch: built {built} vs analytic {summary}")
    summary["built_on_meta_device"] = built
    summary["layout"] = dict(tp=args.tp, pp=args.pp, dp=args.dp, sp=args.sp, seq_len=args.seq_len,
                             micro_batch=args.micro_batch, recompute=args.recompute, dtype=args.dtype)
    summary["memory_per_gpu"] = memory_estimate(
        model, copy, tp=args.tp, pp=args.pp, dp=args.dp, seq_len=args.seq_len, micro_batch=args.micro_batch,
        sp=args.sp, param_bytes=4 if args.dtype == "fp32" else 2, recompute=args.recompute,
    )
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
        ("layout", f"tp={lay['tp']} pp={lay['pp']} dp={lay['dp']} sp={lay['sp']} micro_batch={lay['micro_batch']}"),
        ("params per GPU (largest stage)", _fmt(mem["params_per_gpu"])),
        ("weights / grads (GiB)", f"{mem['weights_gib']:.2f} / {mem['grads_gib']:.2f}"),
        ("optimizer states (GiB)", f"{mem['optimizer_gib']:.2f} (distributed optimizer: "
         f"{mem['optimizer_distributed_gib']:.2f})"),
        ("activations (GiB)", f"{mem['activations_gib']:.2f}"),
        ("total per GPU (GiB)", f"{mem['total_gib']:.2f} (distributed optimizer: "
         f"{mem['total_distributed_optimizer_gib']:.2f})"),
        ("assumptions", mem["assumptions"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=available_presets())
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (shards norm/dropout activations)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--no-copy-head", action="store_true", help="report the plain backbone")
    p.add_argument("--copy-heads", type=int, default=4)
    p.add_argument("--copy-head-dim", type=int, default=64)
    p.add_argument("--copy-qk-norm", action="store_true")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    args = parse_args(argv)
    from cplm_megatron.errors import ConfigError
    from cplm_megatron.parallel.distributed import ParallelConfig, validate_layout

    try:
        validate_layout(args.tp * args.pp * args.dp, ParallelConfig(tp=args.tp, pp=args.pp, sp=args.sp),
                        load_preset(args.preset))
        summary = report(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
