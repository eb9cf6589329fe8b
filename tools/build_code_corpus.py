#!/usr/bin/env python
"""Build the code corpus for SmolLM2-135M-sized runs from the Python sources installed on this machine.

    python tools/build_code_corpus.py --output data/code [--check-size-rules]       # `make data-code`
    python tools/build_code_corpus.py --output /tmp/c --max-bytes 3000000 --vocab-size 2048 --seq-len 256

Sources: the standard library and every site-packages distribution of this interpreter (--root adds a directory; a
missing one, or one without a .py file, is refused; sources that are not UTF-8 text are named and left out).
Split by distribution (no package in two splits; a held-out split whose rule fits no distribution adapts, and
split.json says how), deduplicated by content, held-out near-duplicates of training
files left out, a byte-level BPE trained on a sample of the training files, packed MDS datasets written by every
core: DIR/tokenizer, DIR/train, DIR/dev (tunes the cache control), DIR/val and DIR/split.json (every split's
documents and tokens, the package list with versions, what was left out and why). Deterministic for a given package
set; a rerun with the same sources rewrites nothing but split.json. --check-size-rules exits 1 naming each rule the
corpus breaks (>= 50M training tokens, >= 500 validation documents and >= 2M tokens, no validation document above
1% of its tokens, vocabulary 49,152, no validation content in train).
"""
from __future__ import annotations

import argparse
import json
import sys

from cplm_megatron.data.code_corpus import CodeCorpusSettings, build_code_corpus, check_size_rules

DEFAULTS = CodeCorpusSettings()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="corpus directory")
    p.add_argument("--vocab-size", type=int, default=DEFAULTS.vocab_size)
    p.add_argument("--seq-len", type=int, default=DEFAULTS.seq_len)
    p.add_argument("--val-fraction", type=float, default=DEFAULTS.val_fraction, help="of all source bytes")
    p.add_argument("--dev-fraction", type=float, default=DEFAULTS.dev_fraction, help="of all source bytes")
    p.add_argument("--max-distribution-share", type=float, default=DEFAULTS.max_distribution_share,
                   help="the most of a held-out split's bytes one distribution may supply")
    p.add_argument("--max-document-share", type=float, default=DEFAULTS.max_document_share,
                   help="held-out files above this share of their split's bytes are left out")
    p.add_argument("--tokenizer-sample-bytes", type=int, default=DEFAULTS.tokenizer_sample_bytes,
                   help="training source bytes the tokenizer learns from")
    p.add_argument("--packages", help="comma-separated distribution names: only these (python-stdlib: the stdlib)")
    p.add_argument("--max-bytes", type=int, help="at most this many source bytes: whole distributions in a fixed "
                                                 "hash order while they fit (small corpora for tests)")
    p.add_argument("--root", action="append", default=[], help="another directory of installed distributions")
    p.add_argument("--workers", type=int, help="tokenizer processes (default: every core this process may use)")
    p.add_argument("--check-size-rules", action="store_true", help="exit 1 if the SmolLM2-135M size rules fail")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build, print the split's figures (JSON), check the size rules when asked."""
    args = parse_args(argv)
    if args.workers is not None and args.workers < 1:  # ran in one process, recorded as -3
        print(f"error: --workers must be >= 1 (tokenizer processes), got {args.workers}; leave it out for every core",
              file=sys.stderr)
        return 2
    from cplm_megatron.data.code_sources import check_roots, site_roots

    settings = CodeCorpusSettings(vocab_size=args.vocab_size, seq_len=args.seq_len, val_fraction=args.val_fraction,
                                  dev_fraction=args.dev_fraction,
                                  max_distribution_share=args.max_distribution_share,
                                  max_document_share=args.max_document_share,
                                  tokenizer_sample_bytes=args.tokenizer_sample_bytes)
    packages = [p for p in args.packages.split(",") if p.strip()] if args.packages else None
    try:
        corpus = build_code_corpus(args.output, settings, roots=site_roots(check_roots(args.root)),
                                   packages=packages, max_bytes=args.max_bytes, workers=args.workers,
                                   show_progress=not args.quiet)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    record = corpus.record
    print(json.dumps({"output": str(corpus.root), "seconds": record["seconds"], "workers": record["workers"],
                      "splits": record["splits"], "tokenizer": record["tokenizer"],
                      "held_out_overlap": record["held_out_overlap"], "left_out": record["left_out"]}, indent=2))
    failures = check_size_rules(record)
    if args.check_size_rules:
        for failure in failures:
            print(f"size rule broken: {failure}", file=sys.stderr)
        if failures:
            return 1
        print("size rules: all hold", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
