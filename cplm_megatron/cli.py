"""Shared command-line niceties for the entry points (pretrain, tools)."""
from __future__ import annotations

import functools
import sys
import warnings
from typing import Callable, Optional, Sequence

# Benign on machines without Apex/Transformer Engine (CPU, or a GPU image without TE): megatron-core
# announces its torch fallbacks at import time, once per module, in every process.
_EXPECTED = (
    r".*(Apex|Transformer Engine).* (is|are) not installed.*",
    r".*Transformer Engine and Apex are not installed.*",
    r"full scope is deprecated.*",  # megatron-core's own TransformerConfig default (cuda graphs, unused)
)


def quiet_known_warnings() -> None:
    """Hide megatron-core's expected 'Apex/TE not installed' warnings (call before importing megatron)."""
    for pattern in _EXPECTED:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)


BAD_INPUT_EXIT_CODE = 2  # every entry point's "bad input" code (README: Exit codes)


def exit_2_on(*errors: type) -> Callable:
    """Decorator for an entry point's `main(argv) -> int`: the bad-input contract of every tool -- an error of
    the given types (the input's fault: `UserError`, a missing file, ...) is one `error: ...` line on stderr
    and exit code 2; anything else keeps its traceback (a failure, exit 1)."""

    def wrap(main: Callable[[Optional[Sequence[str]]], int]) -> Callable[[Optional[Sequence[str]]], int]:
        @functools.wraps(main)
        def run(argv: Optional[Sequence[str]] = None) -> int:
            try:
                return main(argv)
            except errors as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
                return BAD_INPUT_EXIT_CODE

        return run

    return wrap
