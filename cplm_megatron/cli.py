"""Shared command-line niceties for the entry points (pretrain, tools)."""
from __future__ import annotations

import functools
import logging
import sys
import warnings
from typing import Callable, Optional, Sequence

# Benign on machines without Apex/Transformer Engine (CPU, or a GPU image without TE): megatron-core
# announces its torch fallbacks at import time, once per module, in every process.
_EXPECTED = (
    r".*(Apex|Transformer Engine).* (is|are) not installed.*",
    r".*Transformer Engine and Apex are not installed.*",
    r"full scope is deprecated.*",  # megatron-core's own TransformerConfig default (cuda graphs, unused)
    r"MimoModelConfig is experimental.*",  # megatron-core >= 0.19 at import; we build no MIMO model
)
# megatron-core >= 0.19 logs this from every GPTModel built (each PP/VPP chunk, every rank 0 start); the head's
# move off GPTModel is tracked in docs/design.md ("HybridModel"), so it is noise on a user's stderr here.
_GPT_DEPRECATION = "GPTModel IS DEPRECATED"


def _drop_gpt_deprecation(record: logging.LogRecord) -> bool:
    return _GPT_DEPRECATION not in record.getMessage()


def quiet_known_warnings() -> None:
    """Hide megatron-core's expected 'Apex/TE not installed' warnings (call before importing megatron)."""
    for pattern in _EXPECTED:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    gpt_logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    if _drop_gpt_deprecation not in gpt_logger.filters:
        gpt_logger.addFilter(_drop_gpt_deprecation)


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


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (sizes, counts and parallel degrees)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (>= 1), got {value}")
    return value
