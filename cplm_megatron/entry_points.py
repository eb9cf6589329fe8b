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
# megatron-core >= 0.19 logs this (rank 0) from every GPTModel built: each PP/VPP chunk, each model a process builds.
_GPT_DEPRECATION = "GPTModel IS DEPRECATED"
GPT_DEPRECATION_NOTE = (
    "[compat] GPTModel is deprecated in megatron-core {version} (bug fixes only; HybridModel replaces it): "
    "CPLMGPTModel still builds on it (setup.py: megatron-core < 0.20); how the head moves to HybridModel: "
    "docs/design.md"
)
_gpt_deprecation_shown = False


def _gpt_deprecation_once(record: logging.LogRecord) -> bool:
    """Logging filter: megatron-core's GPTModel deprecation is shown once per process, as one `[compat]` info line
    on stderr (the first time a GPTModel is built: after a launch's input checks), never again; other records
    pass."""
    global _gpt_deprecation_shown
    if _GPT_DEPRECATION not in record.getMessage():
        return True
    if not _gpt_deprecation_shown:
        _gpt_deprecation_shown = True
        from importlib import metadata

        print(GPT_DEPRECATION_NOTE.format(version=metadata.version("megatron-core")), file=sys.stderr, flush=True)
    return False


def quiet_known_warnings() -> None:
    """Hide megatron-core's expected 'Apex/TE not installed' warnings (call before importing megatron); its
    per-model GPTModel deprecation log (>= 0.19) becomes one `[compat]` line per process."""
    for pattern in _EXPECTED:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    gpt_logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    if _gpt_deprecation_once not in gpt_logger.filters:
        gpt_logger.addFilter(_gpt_deprecation_once)


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
