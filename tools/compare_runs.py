#!/usr/bin/env python
"""Compare two training runs without TensorBoard: a table (final and best train/val loss, tokens, tokens/s, MFU,
peak memory, the config keys that differ) and a plot of loss against tokens (train and val, both runs).

    python tools/compare_runs.py runs/baseline runs/cplm --output runs/compare

Prints the table (markdown) and writes it with the plot into --output (default: compare_<A>_vs_<B>):
comparison.md and loss_vs_tokens.png. Reads each run's metrics.jsonl, run record and config.yaml; a run still
training compares as far as it has logged. Bad input: one `error:` line, exit 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError
from cplm_megatron.training.run_compare import compare_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", metavar="RUN_A", help="a training run dir (its run.dir)")
    parser.add_argument("run_b", metavar="RUN_B", help="another training run dir")
    parser.add_argument("--output", help="directory for comparison.md and loss_vs_tokens.png "
                                         "(default: compare_<A>_vs_<B> in the current directory)")
    return parser.parse_args(argv)


@exit_2_on(UserError)
def main(argv: list[str] | None = None) -> int:
    """Compare, print the table and where the files are."""
    args = parse_args(argv)
    output = Path(args.output or f"compare_{Path(args.run_a).name}_vs_{Path(args.run_b).name}")
    markdown, table, plot = compare_runs(Path(args.run_a), Path(args.run_b), output)
    print(markdown.rsplit("\n![", 1)[0].rstrip())
    print(f"\nwrote {table} and {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
