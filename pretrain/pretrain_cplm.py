#!/usr/bin/env python
"""Pretrain a Megatron-Core GPT backbone with (or without) the Copy-Paste head.

One process per device, launched by torchrun or srun:

  torchrun --nproc_per_node 2 pretrain/pretrain_cplm.py --config configs/tiny.yaml \\
      --set parallel.tp=2 train.iters=50 run.dir=runs/x

Exit codes: 0 done; 75 stopped early with a checkpoint (SIGTERM/SIGUSR1 or train.exit_after_iters):
relaunch the same command to resume from run.dir/checkpoints/latest; 2 bad config; 1 failure.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from cplm_megatron.cli import quiet_known_warnings
from cplm_megatron.config.schema import load_run_config, overrides_from_args
from cplm_megatron.errors import ConfigError, UserError

EXIT_BAD_CONFIG = 2


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML recipe (configs/*.yaml); later --config flags replace earlier ones",
                   action="append")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE",
                   help="dotted overrides applied after the recipe, e.g. --set train.lr=3e-4 parallel.tp=2")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    args = parse_args(argv)
    config_path = args.config[-1] if args.config else None
    try:
        cfg = load_run_config(config_path, overrides_from_args(args.set))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.print_config:
        import io

        import yaml

        buf = io.StringIO()
        yaml.safe_dump(cfg.to_dict(), buf, sort_keys=False)
        print(buf.getvalue())
        return 0
    from cplm_megatron.training.trainer import NonFiniteLossError, train

    try:
        return train(cfg)
    except UserError as e:  # a ConfigError, or an environment that contradicts the job (GPUs promised, no CUDA)
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    except NonFiniteLossError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
