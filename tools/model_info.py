#!/usr/bin/env python
"""Parameter counts, FLOPs per token and a per-GPU memory estimate for a model preset and layout;
which layouts fit a GPU's memory (cplm_megatron/model/info.py).

The model is built for real by `build_run` on the meta device (no memory is allocated, even for 13B) and its
parameter count is checked against the analytic formula. The memory estimate counts the LM head's loss per
`--lm-head-loss` (Megatron's logits, or one tile) and the optimizer states left on the GPU with
`--offload-fraction`; `--gpu-memory 80GB` says whether the layout fits, and `--plan` lists the layouts of
`--gpus` GPUs that fit, least costly first. `--attention` follows `model.attention_impl` (sdpa/te: flash, no
T x T activations; megatron: the unfused one's probabilities). A layout the trainer refuses is refused here
with the same error (e.g. PP x CP).

  python tools/model_info.py --preset smollm2-1.7b --tp 2 --pp 1 --dp 8 --seq-len 2048 --micro-batch 4
  python tools/model_info.py --preset llama-13b --gpu-memory 80GB --plan --gpus 8 --seq-len 4096
  python tools/model_info.py --config configs/smollm2_1p7b.yaml --gpus 16 --gpu-memory 80GB

`--config RECIPE` (a file or a shipped recipe's name, with `--set key=value` overrides) takes the model, the copy
head, tp/pp/cp/sp, the sequence length, micro batch, recomputation, precision, attention, document masking, the
optimizer offload and the LM-head loss path from the recipe; the data-parallel size is `--dp`, or `--gpus` divided
by tp x pp x cp. `model.lm_head_loss: auto` is resolved as a launch would on a GPU of `--gpu-memory` (Megatron's
path without it).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any, Dict, List, Optional

from cplm_megatron.entry_points import exit_2_on, positive_int, quiet_known_warnings
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import available_presets
from cplm_megatron.model.info import InfoRequest, format_table, parse_memory, report
from cplm_megatron.parallel.cpu_compat import setup_compat


def gpu_memory(text: str) -> float:
    """An argparse type: a GPU's memory in GiB (cplm_megatron.model.info.parse_memory)."""
    try:
        return parse_memory(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command line (its defaults tell which options a user gave explicitly)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=available_presets())
    source.add_argument("--config", metavar="RECIPE", help="a recipe (configs/*.yaml or a shipped recipe's name): "
                        "its model, copy head, layout, sequence, micro batch, precision and loss path")
    add("--set", nargs="+", action="append", default=[], metavar="KEY=VALUE", help="with --config: overrides")
    add("--json", action="store_true", help="print JSON instead of a table")
    for name, text in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context (the sequence split over N GPUs)"),
                       ("dp", "data")):
        add(f"--{name}", type=positive_int, default=None, help=f"{text} parallelism (default 1, or the recipe's)")
    add("--sp", action="store_true", help="sequence parallelism (shards norm/dropout activations)")
    add("--seq-len", type=positive_int, default=None, help="default 2048, or the recipe's train.seq_len")
    add("--micro-batch", type=positive_int, default=None, help="default 1, or the recipe's train.micro_batch")
    add("--recompute", choices=["none", "selective", "full"], default="none")
    add("--lm-head-loss", choices=["megatron", "chunked", "fused"], default=None,
        help="model.lm_head_loss: Megatron's logits, or the loss over tiles (no logits tensor)")
    add("--attention", choices=["sdpa", "te", "megatron"], default="sdpa",
        help="model.attention_impl as resolved: sdpa/te (flash) or megatron (unfused, [b,heads,s,s])")
    add("--document-masking", action="store_true", help="data.document_masking: the step's [b,1,s,s] mask")
    add("--offload-fraction", type=float, default=0.0, help="optimizer.offload_fraction (states on the CPU)")
    add("--gpu-memory", type=gpu_memory, help="GPU memory, e.g. 80GB (decimal) or 80GiB: does it fit?")
    add("--reserve", type=float, default=0.1, help="fraction of --gpu-memory kept free (CUDA context, NCCL)")
    add("--plan", action="store_true", help="with --gpu-memory: list the layouts of --gpus GPUs that fit")
    add("--gpus", type=positive_int, default=8, help="GPUs for --plan (default: one 8-GPU node)")
    add("--dtype", choices=["bf16", "fp32"], default="bf16")
    add("--no-copy-head", action="store_true", help="report the plain backbone")
    add("--copy-heads", type=positive_int, default=4)
    add("--copy-head-dim", type=positive_int, default=64)
    add("--copy-qk-norm", action="store_true")
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def request_from_recipe(args: Dict[str, Any]) -> Dict[str, Any]:
    """InfoRequest fields from `--config RECIPE [--set ...]`; options given on the command line win."""
    from cplm_megatron.model.layout import validate_layout
    from cplm_megatron.model.lm_head_choice import choose_lm_head_loss
    from cplm_megatron.run_config import load_run_config, overrides_from_args

    cfg = load_run_config(args.pop("config"), overrides_from_args(args.pop("set")))
    m, c, p, t = cfg.model, cfg.copy_head, cfg.parallel, cfg.train
    recipe = dict(preset=m.preset or "(recipe)", model=m, tp=p.tp, pp=p.pp, cp=p.cp, sp=p.sp, seq_len=t.seq_len,
                  micro_batch=t.micro_batch, recompute=cfg.recompute.granularity,
                  attention="megatron" if m.attention_impl == "megatron" else ("te" if m.attention_impl == "te" else "sdpa"),
                  document_masking=cfg.data.document_masking, offload_fraction=cfg.optimizer.offload_fraction,
                  dtype="fp32" if cfg.precision.dtype == "fp32" else "bf16", no_copy_head=not c.enabled,
                  copy_heads=c.heads, copy_head_dim=c.head_dim, copy_qk_norm=c.qk_norm)
    parser = build_parser()
    explicit = {k: v for k, v in args.items() if v != parser.get_default(k)}
    merged = {**args, **recipe, **{k: v for k, v in explicit.items() if k in recipe}}
    if not args.get("dp"):
        model_parallel = merged["tp"] * merged["pp"] * merged["cp"]
        validate_layout(model_parallel, cfg.parallel, m)  # the model's own limits first (TP vs heads, ...)
        if merged["gpus"] % model_parallel:
            raise ConfigError(f"--gpus {merged['gpus']} is not a multiple of the recipe's tp x pp x cp = {model_parallel}")
        merged["dp"] = merged["gpus"] // model_parallel
    loss = explicit.get("lm_head_loss") or m.lm_head_loss
    if loss == "auto":
        memory = merged.get("gpu_memory")
        loss = "megatron" if memory is None else choose_lm_head_loss(
            m, merged["seq_len"] * merged["micro_batch"] // merged["cp"], merged["tp"],
            4 if merged["dtype"] == "fp32" else 2, memory * (1 - merged["reserve"]) * 2**30, "the GPU", True).path
    merged["lm_head_loss"] = loss
    merged["model"] = replace(m, lm_head_loss=loss)
    return merged


def resolve_request(args: Dict[str, Any]) -> InfoRequest:
    """The InfoRequest of the command line: a preset and explicit options, or a recipe (`--config`)."""
    if args.get("config"):
        return InfoRequest(**request_from_recipe(args))
    if args.pop("set"):
        raise ConfigError("--set needs --config RECIPE (with --preset, give the options directly)")
    args.pop("config")
    defaults = dict(tp=1, pp=1, cp=1, dp=1, seq_len=2048, micro_batch=1, lm_head_loss="megatron")
    return InfoRequest(**{k: (defaults[k] if v is None and k in defaults else v) for k, v in args.items()})


@exit_2_on(ConfigError)
def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    args = vars(parse_args(argv))
    as_json = args.pop("json")
    request = resolve_request(args)
    setup_compat()  # report() builds the model on the meta device in one process
    summary = report(request)
    print(json.dumps(summary, indent=2) if as_json else format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
