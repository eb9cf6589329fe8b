#!/usr/bin/env python
"""Tokenize documents and pack them into fixed-length samples stored as MDS shards (zstd).

    python tools/prepare_data.py --input corpus/ --tokenizer tok/ --output data/mine --seq-len 2048 --workers 8
    python tools/prepare_data.py --part 2/8 --input 'corpus/**/*.jsonl.zst' @more.txt ...  # 1/8 of the files
    python tools/prepare_data.py --merge --output data/big    # one dataset from data/big/part-*-of-00008
    python tools/prepare_data.py --input saved_ds/ --text-field content --tokenizer tok/ --output data/x --seq-len 2048
    python tools/prepare_data.py --input megatron/corpus_text_document --tokenizer tok/ --output data/x --seq-len 2048

Each document gets an EOD appended; windows of seq_len + 1 tokens overlap by one (every token is a label
once); the last is EOD-padded (loss-mask 0). OUTPUT (index.json, shard.*.mds.zstd, manifest.json) appears only
when complete; a rerun with the same inputs, tokenizer and settings says "up to date" (shards checked) or
rebuilds a damaged dataset ("repaired"). --input takes files (text, .jsonl, .parquet; --text-field names the
field), directories, quoted globs (** spans directories), @LIST files, a `datasets` save_to_disk folder and a
Megatron indexed dataset (PREFIX of PREFIX.bin/.idx: its ids are re-packed as they are, so --tokenizer must be the
tokenizer that made them). Mostly-not-text inputs are refused (--max-invalid-utf8). Bad input: one `error:` line,
exit 2.
The README (Data, "Past one machine") explains parts and the merge (slurm/prepare_data.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from cplm_megatron.data.documents import InputError, add_reading_arguments
from cplm_megatron.data.inputs import parse_part
from cplm_megatron.data.parts import merge_parts
from cplm_megatron.data.prepare import DEFAULT_PROGRESS_INTERVAL, prepare_dataset
from cplm_megatron.data.shards import DEFAULT_SHARD_SIZE_LIMIT
from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", help="files, directories, glob patterns or @LIST files of text; "
                        "datasets save_to_disk folders; Megatron PREFIX (.bin/.idx)")
    parser.add_argument("--tokenizer", help="local Hugging Face tokenizer directory")
    parser.add_argument("--output", required=True, help="dataset directory to write")
    parser.add_argument("--seq-len", type=int, help="training sequence length (samples hold +1)")
    parser.add_argument("--part", metavar="I/N", help="prepare only part I of N (1-based) into OUTPUT/part-I-of-N")
    parser.add_argument("--merge", action="store_true", help="join OUTPUT/part-*-of-N into one dataset at OUTPUT")
    parser.add_argument("--parts", type=int, metavar="N", help="with --merge: the number of parts expected")
    parser.add_argument("--progress-every", type=float, default=DEFAULT_PROGRESS_INTERVAL, metavar="SEC",
                        help="seconds between progress lines when stderr is not a terminal (job logs)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="tokenizer processes")
    add_reading_arguments(parser)
    parser.add_argument("--shard-size", default=DEFAULT_SHARD_SIZE_LIMIT, help="uncompressed bytes per shard, e.g. 64mb")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


@exit_2_on(UserError)
def main(argv: list[str] | None = None) -> int:
    """Prepare (or confirm up to date) and print the manifest summary as JSON."""
    args = parse_args(argv)
    if args.merge:
        return merge(args)
    missing = [flag for flag, value in (("--input", args.input), ("--tokenizer", args.tokenizer),
                                        ("--seq-len", args.seq_len)) if value is None]
    if missing:
        raise InputError(f"{' and '.join(missing)} required (only --merge goes without)")
    if args.parts is not None:
        raise InputError("--parts goes with --merge; to prepare one part use --part I/N")
    part = parse_part(args.part) if args.part is not None else None
    result = prepare_dataset(
        args.input, args.tokenizer, args.output, seq_len=args.seq_len, workers=args.workers,
        split_by=args.split_by, text_field=args.text_field, shard_size_limit=args.shard_size,
        show_progress=not args.quiet, max_invalid_fraction=args.max_invalid_utf8, part=part,
        progress_interval=args.progress_every,
    )
    if result.damage:
        print(f"[prepare_data] the existing dataset was damaged and has been rebuilt: {result.damage}",
              file=sys.stderr)
    print(json.dumps(result.summary(part), indent=2))
    return 0


def merge(args: argparse.Namespace) -> int:
    """--merge: one dataset at --output from its parts."""
    given = [flag for flag, value in (("--input", args.input), ("--part", args.part)) if value is not None]
    if given:
        raise InputError(f"--merge takes only --output (and --parts N); drop {' and '.join(given)}")
    if args.parts is not None and args.parts < 1:
        raise InputError(f"--parts must be >= 1, got {args.parts}")
    print(json.dumps(merge_parts(args.output, expected_parts=args.parts).summary(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
