#!/usr/bin/env python
"""Convert a local Hugging Face Llama-family checkpoint into a Megatron torch_dist checkpoint root.

    python tools/convert_from_hf.py --hf smollm2-135m/ --output ckpt/smollm2 --preset smollm2-135m

Writes OUTPUT/iter_0000000 + OUTPUT/latest (model weights only, no optimizer state) and copies the
tokenizer to OUTPUT/tokenizer. pretrain_cplm.py continues from it at any TP/PP with
`--set checkpoint.load=OUTPUT checkpoint.load_optimizer=false model.preset=...` (the tool prints the
full list). The Copy-Paste head is freshly initialized unless --no-copy-head (an HF CPLM checkpoint
keeps its trained head). Runs in one process on CPU (GPUs are hidden from it).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from cplm_megatron.entry_points import exit_2_on, quiet_known_warnings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", required=True, help="local HF checkpoint directory (config.json + weights)")
    parser.add_argument("--output", required=True, help="checkpoint root to write (new or empty)")
    parser.add_argument("--preset", help="model preset the HF config must match (recorded for training)")
    parser.add_argument("--no-copy-head", action="store_true", help="plain backbone, no Copy-Paste head")
    parser.add_argument("--copy-heads", type=int, help="copy heads of the fresh head (default 4)")
    parser.add_argument("--copy-head-dim", type=int, help="width of each copy head (default 64)")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the fresh copy-head initialization")
    args = parser.parse_args(argv)
    if args.no_copy_head and (args.copy_heads is not None or args.copy_head_dim is not None):
        parser.error("--copy-heads/--copy-head-dim describe the copy head; they cannot go with --no-copy-head")
    return args


@exit_2_on(ValueError, FileNotFoundError, FileExistsError)
def main(argv: list[str] | None = None) -> int:
    """Convert; errors about the inputs print one line and exit with 2."""
    quiet_known_warnings()
    args = parse_args(argv)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before CUDA initializes: the model it builds stays on CPU
    from cplm_megatron.hf.convert import convert_from_hf
    from cplm_megatron.parallel.megatron_patches import setup_compat

    logging.basicConfig(level=logging.WARNING, format="[convert_from_hf] %(message)s")
    logging.getLogger("cplm_megatron").setLevel(logging.INFO)
    setup_compat()  # it builds the Megatron model in one process
    out = convert_from_hf(args.hf, args.output, copy_head=not args.no_copy_head, preset=args.preset,
                          copy_heads=args.copy_heads, copy_head_dim=args.copy_head_dim, seed=args.seed)
    print(f"[convert_from_hf] done: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
