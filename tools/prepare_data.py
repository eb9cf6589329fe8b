#!/usr/bin/env python
"""Tokenize documents and pack them into fixed-length samples stored as MDS shards (zstd).

    python tools/prepare_data.py --input corpus/ --tokenizer tok/ --output data/mine --seq-len 2048 --workers 8

Each document gets an EOD token appended; the token stream is cut into windows of seq_len + 1
tokens that overlap by one token (every token is a label once); document boundaries are stored per
sample. The last window is padded with EOD; the loader gives those labels loss-mask 0. The output
directory holds index.json, shard.*.mds.zstd and manifest.json (documents, tokens, samples,
tokenizer name/sha256/vocab size/EOD id, seq_len, source files). It appears only when complete; a
rerun with the same inputs (paths, sizes, mtimes), tokenizer and settings checks the shards against
index.json (sizes, hashes) and prints "up to date", or rebuilds a damaged dataset ("repaired"). Input
files that are mostly not text (binary, UTF-16, Latin-1) are refused; see --max-invalid-utf8.
Bad input: one `error:` line on stderr, exit code 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from cplm_megatron.cli import exit_2_on
from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, SPLIT_MODES
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.shards import DEFAULT_SHARD_SIZE_LIMIT
from cplm_megatron.errors import UserError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True, help="files or directories of text")
    parser.add_argument("--tokenizer", required=True, help="local Hugging Face tokenizer directory")
    parser.add_argument("--output", required=True, help="dataset directory to write")
    parser.add_argument("--seq-len", type=int, required=True, help="training sequence length (samples hold +1)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="tokenizer processes")
    parser.add_argument("--split-by", choices=SPLIT_MODES, default="file",
                        help="documents of plain-text files: whole file, each line, or blank-line paragraphs")
    parser.add_argument("--text-field", default="text", help="JSON field / parquet column holding the text")
    parser.add_argument("--shard-size", default=DEFAULT_SHARD_SIZE_LIMIT, help="uncompressed bytes per shard, e.g. 64mb")
    parser.add_argument("--max-invalid-utf8", type=float, default=DEFAULT_MAX_INVALID_FRACTION, metavar="FRACTION",
                        help="refuse an input file whose share of invalid-UTF-8/NUL bytes is larger (binary data, "
                             "another encoding); 1 accepts anything (bad bytes are replaced). Default: %(default)s")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


@exit_2_on(UserError)
def main(argv: list[str] | None = None) -> int:
    """Prepare (or confirm up to date) and print the manifest summary as JSON."""
    args = parse_args(argv)
    result = prepare_dataset(
        args.input, args.tokenizer, args.output, seq_len=args.seq_len, workers=args.workers,
        split_by=args.split_by, text_field=args.text_field, shard_size_limit=args.shard_size,
        show_progress=not args.quiet, max_invalid_fraction=args.max_invalid_utf8,
    )
    manifest = result.manifest
    if result.damage:
        print(f"[prepare_data] the existing dataset was damaged and has been rebuilt: {result.damage}",
              file=sys.stderr)
    summary = {
        "status": ("repaired" if result.damage else "written") if result.rebuilt else "up to date",
        "output": str(result.output),
        "documents": manifest.documents,
        "tokens": manifest.tokens,
        "samples": manifest.samples,
        "seq_len": manifest.seq_len,
        "tokenizer": manifest.tokenizer.name,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
