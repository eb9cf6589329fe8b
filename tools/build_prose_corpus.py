#!/usr/bin/env python
"""Build the English prose corpus from Debian's documentation packages (cplm_megatron/data/prose_corpus.py).

    python tools/build_prose_corpus.py --install --output data/prose_v4096 --code-corpus data/code_v4096

--install first installs the source packages that are missing through apt-get (root and a Debian mirror; `make
data-emergence` runs this); without it a missing package is one error line naming the apt-get command.

DIR/tokenizer, DIR/train, DIR/dev, DIR/val and DIR/split.json (sizes, each package's version and licences, what was
left out and why, the overlap with the code corpus); DIR/text holds the extracted documents.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError


@exit_2_on(UserError)
def main(argv: list[str] | None = None) -> int:
    from cplm_megatron.data.prose_corpus import ProseCorpusSettings, build_prose_corpus
    from cplm_megatron.data.prose_sources import SOURCES, install_missing

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="corpus directory")
    p.add_argument("--code-corpus", help="a built code corpus whose sources no prose document may near-duplicate")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--packages", help="comma-separated source packages (default: all of "
                   f"{', '.join(s.package for s in SOURCES)})")
    p.add_argument("--workers", type=int, help="tokenizer processes (default: every core this process may use)")
    p.add_argument("--install", action="store_true", help="apt-get install the missing source packages first")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    settings = ProseCorpusSettings()
    settings = replace(settings, split=replace(settings.split, vocab_size=args.vocab_size, seq_len=args.seq_len))
    if args.packages:
        settings = replace(settings, packages=tuple(x.strip() for x in args.packages.split(",") if x.strip()))
    if args.install:
        install_missing([s for s in SOURCES if s.package in settings.packages])
    try:
        build_prose_corpus(args.output, settings, args.code_corpus, args.workers, show_progress=not args.quiet)
    except ValueError as err:
        raise UserError(str(err)) from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
