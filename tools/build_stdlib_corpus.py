#!/usr/bin/env python
"""Build the embedded default corpus from this interpreter's standard library sources.

    python tools/build_stdlib_corpus.py --output data/stdlib [--vocab-size 4096] [--seq-len 256]

Writes DIR/tokenizer (byte-level BPE trained on the training modules), DIR/train, DIR/dev and
DIR/val (packed MDS datasets with manifests; validation: modules of 1-24 KiB in 30% of the range of a
hash of the module name, dev: the next 5%; generated and near-duplicate modules stay in train) and DIR/split.json
(what moved to train and why; the fraction of validation 32-token windows found verbatim in
training). Idempotent: a rerun on the same interpreter does nothing but rewrite DIR/summary.json (sizes, splits,
overlap), which the one line it prints names.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from cplm_megatron.data.stdlib_corpus import (
    DEFAULT_DEV_FRACTION,
    DEFAULT_MAX_BYTES,
    DEFAULT_VAL_FRACTION,
    NEAR_DUPLICATE_FRACTION,
    build_stdlib_corpus,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="corpus directory")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="cap on source bytes (a deterministic subset is taken above it)")
    parser.add_argument("--val-fraction", type=float, default=DEFAULT_VAL_FRACTION,
                        help="share of the module-name hash range drawn for validation (modules of 1-24 KiB)")
    parser.add_argument("--dev-fraction", type=float, default=DEFAULT_DEV_FRACTION,
                        help="share of modules in the dev split (tuning; 0: none)")
    parser.add_argument("--near-duplicate", type=float, default=NEAR_DUPLICATE_FRACTION,
                        help="a held-out module sharing this fraction of its 16-word shingles with train moves to train")
    parser.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: min(4, cores))")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build (or confirm up to date); one line on stdout, the JSON summary in DIR/summary.json."""
    args = parse_args(argv)
    start = time.perf_counter()
    corpus = build_stdlib_corpus(
        args.output, vocab_size=args.vocab_size, seq_len=args.seq_len, max_bytes=args.max_bytes,
        val_fraction=args.val_fraction, workers=args.workers, show_progress=not args.quiet,
        dev_fraction=args.dev_fraction, near_duplicate=args.near_duplicate,
    )
    parts = [("train", corpus.train_dir, corpus.train), ("val", corpus.val_dir, corpus.val)]
    if corpus.dev is not None:
        parts.append(("dev", corpus.dev_dir, corpus.dev))
    summary = {
        "status": "built" if corpus.rebuilt else "up to date",
        "output": str(corpus.root),
        "seconds": round(time.perf_counter() - start, 1),
        "tokenizer": {"path": str(corpus.tokenizer_dir), "vocab_size": corpus.tokenizer.vocab_size},
        **{
            split: {"path": str(path), "files": len(m.source_files), "documents": m.documents,
                    "tokens": m.tokens, "samples": m.samples}
            for split, path, m in parts
        },
        "moved_to_train": len(corpus.split["moved_to_train"]),
        "held_out_sizes": corpus.split["sizes"],
        "verbatim_overlap": {k: v["fraction_in_train"] for k, v in corpus.split["verbatim_overlap"].items()},
    }
    (corpus.root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    sizes = ", ".join(f"{split} {m.documents:,} documents / {m.tokens:,} tokens" for split, _, m in parts)
    print(f"[stdlib corpus] {summary['status']}: {corpus.root} (vocabulary {corpus.tokenizer.vocab_size:,}; {sizes}; "
          f"details: {corpus.root / 'summary.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
