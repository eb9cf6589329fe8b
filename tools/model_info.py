#!/usr/bin/env python
"""Parameter counts, FLOPs per token and a per-GPU memory estimate for a model preset or a recipe and a layout;
whether it fits a GPU, and which layouts fit (cplm_megatron/model/sizing/info.py).

The model is built for real by `build_run` on the meta device and its parameter count checked against the
analytic formula. The memory estimate counts the LM head's loss per `--lm-head-loss` and the optimizer states left
on the GPU with `--offload-fraction`. `--gpu-memory 80GB` (decimal; 80GiB binary) says whether the layout fits such
a GPU; without it, the named GPUs (H100 80GB, H200 141GB) each get a verdict and the largest micro-batch they hold.
`--plan` lists the layouts of `--gpus` GPUs that fit, least costly first. A layout the trainer refuses is refused
here with the same error (e.g. PP x CP).

  python tools/model_info.py --preset smollm2-1.7b --tp 2 --pp 1 --dp 8 --seq-len 2048 --micro-batch 4
  python tools/model_info.py --preset llama-13b --gpu-memory 80GB --plan --gpus 8 --seq-len 4096
  python tools/model_info.py --config configs/smollm2_1p7b.yaml

`--config RECIPE` (a file or a shipped recipe's name, `--set key=value` overrides) takes the model, copy head,
tp/pp/cp/sp, sequence, micro and global batch, recomputation, precision, attention, document masking, offload and
LM-head loss from the recipe, and its data-parallel size from its header ("dp=16"); `--dp` or `--gpus` win.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from cplm_megatron.entry_points import exit_2_on, positive_int, quiet_known_warnings
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import available_presets
from cplm_megatron.model.sizing.info import format_table, parse_memory, report, resolve_request
from cplm_megatron.model.sizing.planner import DEVICE_RESERVE
from cplm_megatron.parallel.megatron_patches import setup_compat


def gpu_memory(text: str) -> float:
    """An argparse type: a GPU's memory in GiB (cplm_megatron.model.sizing.info.parse_memory)."""
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
    source.add_argument("--config", metavar="RECIPE", help="a recipe (configs/*.yaml or a shipped recipe's name)")
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
    add("--reserve", type=float, default=DEVICE_RESERVE, help="fraction of a GPU's memory kept free")
    add("--plan", action="store_true", help="with --gpu-memory: list the layouts of --gpus GPUs that fit")
    add("--gpus", type=positive_int, default=8, help="GPUs for --plan, and a recipe's dp (default 8)")
    add("--dtype", choices=["bf16", "fp32"], default="bf16")
    add("--no-copy-head", action="store_true", help="report the plain backbone")
    add("--copy-heads", type=positive_int, default=4)
    add("--copy-head-dim", type=positive_int, default=64)
    add("--copy-qk-norm", action="store_true")
    return p


@exit_2_on(ConfigError)
def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    request = resolve_request(args, {k: parser.get_default(k) for k in args})
    setup_compat()  # report() builds the model on the meta device in one process
    summary = report(request)
    print(json.dumps(summary, indent=2) if as_json else format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
