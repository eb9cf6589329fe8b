#!/usr/bin/env python
"""Write docs/config-reference.md from the config dataclasses (cplm_megatron/training/config_reference.py).

    python tools/config_reference.py            # regenerate the page
    python tools/config_reference.py --check    # exit 1 if the committed page is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import ConfigError
from cplm_megatron.training.config_reference import PAGE, render

REPO = Path(__file__).resolve().parents[1]


@exit_2_on(ConfigError)
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", default=str(REPO / PAGE), help=f"the page to write (default: {PAGE})")
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if the page differs")
    args = p.parse_args(argv)
    page, text = Path(args.output), render()
    if args.check:
        if not page.is_file() or page.read_text() != text:
            print(f"{page} is stale: run `python tools/config_reference.py`", file=sys.stderr)
            return 1
        print(f"{page} is up to date")
        return 0
    page.write_text(text)
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
