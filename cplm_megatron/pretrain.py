"""Pretrain a Megatron-Core GPT backbone with (or without) the Copy-Paste head.

One process per device, launched by torchrun or srun (`pretrain/pretrain_cplm.py` in a checkout,
`python -m cplm_megatron.pretrain` or `cplm-pretrain` where the package is installed; `--config` takes a
recipe file or the name of a shipped recipe, e.g. `tiny`):

  torchrun --nproc_per_node 2 pretrain/pretrain_cplm.py --config configs/tiny.yaml \\
      --set parallel.tp=2 train.iters=50 run.dir=runs/x

Exit codes: 0 done; 75 stopped early with a checkpoint (Ctrl-C/SIGINT, SIGTERM, SIGUSR1 or
train.exit_after_iters): relaunch the same command to resume from run.dir/checkpoints/latest; a second
Ctrl-C stops at once (130); 2 bad input (config, data, checkpoint, disk, memory: one line on stderr naming
the fix; nothing in run.dir written or deleted); 1 failure (one `error:` line; helper processes are
stopped). torchrun turns every worker exit code other than 0 into 1: launch with
pretrain/launch_torchrun.py to keep 75 and 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from cplm_megatron.training.exit_status import BAD_INPUT_EXIT_CODE, record_exit_status
from cplm_megatron.training.signals import RESUME_EXIT_CODE, defer_stop_signals, kill_descendants


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML recipe (configs/*.yaml); later --config flags replace earlier ones",
                   action="append")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE",
                   help="dotted overrides applied after the recipe, e.g. --set train.lr=3e-4 parallel.tp=2")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--check", action="store_true",
                   help="check the config against this launch (keys, values, the layout against the number of "
                        "processes) without torch, print one line and exit: 0 if it would start, 2 if not")
    p.add_argument("--describe", action="store_true",
                   help="with --print-config: each key's meaning as a comment (docs/config-reference.md)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="start-up details too: the megatron-core patches, megatron-core's warnings, the optimizer's "
                        "kernel (CPLM_VERBOSE=1 does the same)")
    return p.parse_args(argv)


def checked_config(args: argparse.Namespace, world_size: Optional[int]):
    """The run config of the command line, with every check that needs no process group: the keys and values, and
    (`world_size` given) the layout against the model and the number of processes. Raises UserError."""
    from cplm_megatron.run_config import load_run_config, overrides_from_args

    cfg = load_run_config(args.config[-1] if args.config else None, overrides_from_args(args.set))
    if world_size is not None:
        cfg.validate_world(world_size)
    return cfg


def run(args: argparse.Namespace) -> int:
    """Resolve the config, then print it or train; bad input is one line on stderr and exit code 2. A config
    refused before any process group is the same on every rank: rank 0 prints it, every rank exits 2."""
    import os

    from cplm_megatron.entry_points import quiet_known_warnings, set_verbose
    from cplm_megatron.errors import UserError
    from cplm_megatron.parallel.env import detect_env

    if args.verbose:
        set_verbose()
    quiet_known_warnings()
    # Megatron's TP/SP communication stays ordered with the kernels it overlaps on one CUDA connection (as
    # slurm/launch.sh sets it); read when CUDA starts, after this
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    env = detect_env()
    try:
        cfg = checked_config(args, None if args.print_config else env.world_size)
    except UserError as e:
        if env.rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE
    if args.print_config:
        print_config(cfg, args.describe)
        return 0
    if args.check:
        if env.rank == 0:
            print(check_summary(cfg, env.world_size), flush=True)
        return 0
    try:
        from cplm_megatron.checkpoint.checkpointer import CheckpointWriterDied
        from cplm_megatron.evaluation.probes import probe_callbacks
        from cplm_megatron.parallel.megatron_patches import setup_compat
        from cplm_megatron.training.trainer import NonFiniteLossError, train

        setup_compat()
        try:
            return train(cfg, probe_callbacks(cfg))
        except (NonFiniteLossError, CheckpointWriterDied) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 1
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE


def check_summary(cfg, world_size: int) -> str:
    """`--check`'s line: the layout and length the checked config would train with."""
    p, t = cfg.parallel, cfg.train
    return (f"config ok: {world_size} process(es) as tp={p.tp} pp={p.pp} cp={p.cp} dp={cfg.validate_world(world_size)}; "
            f"{t.total_iters()} iterations of {t.global_batch} x {t.seq_len} tokens; run.dir={cfg.run.dir}")


def print_config(cfg, describe: bool) -> None:
    """The resolved config as YAML (`--print-config`), with each key's meaning as a comment (`--describe`)."""
    if describe:
        from cplm_megatron.training.config_reference import describe as described

        print(described(cfg))
        return
    import yaml

    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def main(argv: Optional[List[str]] = None) -> int:
    import signal

    mask = defer_stop_signals()  # before the heavy imports: a stop signal during start-up is not lost
    code = 1  # an exception escaping is a failure
    try:
        code = run(parse_args(argv))
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        code = e.code if isinstance(e.code, int) else 1
        raise
    finally:
        record_exit_status(code)  # for pretrain/launch_torchrun.py (torchrun reports only 0 or 1)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # for an in-process caller (tests)
    return code


def script_main(argv: Optional[List[str]] = None) -> int:
    """`main` as a process's whole life: a failed run leaves no helper process behind (a dead writer's
    orphaned workers). The entry point of the script, `python -m` and the console script."""
    exit_code = main(argv)
    if exit_code not in (0, BAD_INPUT_EXIT_CODE, RESUME_EXIT_CODE):
        from cplm_megatron.training.metrics_log import stop_wandb_service

        stop_wandb_service()  # wandb's service is a descendant too: stopped, not killed
        kill_descendants()
    return exit_code


if __name__ == "__main__":
    sys.exit(script_main())
