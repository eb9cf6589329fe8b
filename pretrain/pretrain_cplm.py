#!/usr/bin/env python
"""Pretrain a Megatron-Core GPT backbone with (or without) the Copy-Paste head: `cplm_megatron/pretrain.py`
(also `python -m cplm_megatron.pretrain`) as a script of the checkout.

  torchrun --nproc_per_node 2 pretrain/pretrain_cplm.py --config configs/tiny.yaml \\
      --set parallel.tp=2 train.iters=50 run.dir=runs/x
"""
import sys

from cplm_megatron.pretrain import main, parse_args, run, script_main  # noqa: F401 - the script's interface

if __name__ == "__main__":
    sys.exit(script_main())
