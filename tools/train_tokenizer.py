#!/usr/bin/env python
"""Train a byte-level BPE tokenizer on local text and save it as a Hugging Face tokenizer directory.

    python tools/train_tokenizer.py --input corpus/ extra.jsonl.zst --vocab-size 4096 --output tok/

Inputs: text files (.txt .md .rst .py), JSON lines with a text field, parquet with a text column;
.gz/.zst compressed text and JSON lines too; directories are searched recursively. The EOD token
(default <|endoftext|>, id 0) is also the BOS, EOS and padding token. The result loads with
`transformers.AutoTokenizer.from_pretrained(DIR)`. A rerun with unchanged inputs and settings
does nothing; an interrupted run leaves no output directory behind. Inputs may also be glob patterns
(quoted; ** spans directories) and @LIST files (one input per line). --max-docs N trains on a sample of N
documents over the same inputs: the files of smallest path hash (spread over the corpus, deterministic),
read until N documents -- for corpora far larger than a tokenizer needs.
"""
from __future__ import annotations

import argparse
import json
import sys

from cplm_megatron.data.documents import add_reading_arguments
from cplm_megatron.data.tokenizer import DEFAULT_EOD_TOKEN
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files
from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", nargs="+", required=True,
                        help="files, directories, glob patterns or @LIST files of text")
    parser.add_argument("--max-docs", type=int, metavar="N",
                        help="train on a deterministic sample of at most N documents of the inputs")
    parser.add_argument("--vocab-size", type=int, required=True, help="vocabulary size incl. the EOD token")
    parser.add_argument("--output", required=True, help="tokenizer directory to write")
    parser.add_argument("--eod-token", default=DEFAULT_EOD_TOKEN, help="end-of-document token (also BOS/EOS/pad)")
    add_reading_arguments(parser)
    parser.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


@exit_2_on(UserError)
def main(argv: list[str] | None = None) -> int:
    """Train (or confirm up to date) and print a JSON summary."""
    args = parse_args(argv)
    result = train_tokenizer_from_files(
        args.input, args.vocab_size, args.output, eod_token=args.eod_token, split_by=args.split_by,
        text_field=args.text_field, min_frequency=args.min_frequency, show_progress=not args.quiet,
        max_invalid_fraction=args.max_invalid_utf8, max_docs=args.max_docs,
    )
    status = "trained" if result.rebuilt else "up to date"
    print(json.dumps({"status": status, "output": str(result.output), **result.info.to_dict()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
