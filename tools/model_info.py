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
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from cplm_megatron.cli import exit_2_on, positive_int, quiet_known_warnings
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


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--preset", required=True, choices=available_presets())
    add("--json", action="store_true", help="print JSON instead of a table")
    for name, text in (("tp", "tensor"), ("pp", "pipeline"), ("cp", "context (the sequence split over N GPUs)"),
                       ("dp", "data")):
        add(f"--{name}", type=positive_int, default=1, help=f"{text} parallelism")
    add("--sp", action="store_true", help="sequence parallelism (shards norm/dropout activations)")
    add("--seq-len", type=positive_int, default=2048)
    add("--micro-batch", type=positive_int, default=1)
    add("--recompute", choices=["none", "selective", "full"], default="none")
    add("--lm-head-loss", choices=["megatron", "chunked", "fused"], default="megatron",
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
    return p.parse_args(argv)


@exit_2_on(ConfigError)
def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    args = vars(parse_args(argv))
    setup_compat()  # report() builds the model on the meta device in one process
    as_json = args.pop("json")
    summary = report(InfoRequest(**args))
    print(json.dumps(summary, indent=2) if as_json else format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
