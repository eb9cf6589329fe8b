"""Shared command-line niceties for the entry points (pretrain, tools)."""
from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from typing import Callable, Optional, Sequence

# Start-up details (the megatron-core patches, megatron-core's notes and warnings, the optimizer's kernel) are shown
# only when verbose: `--verbose` of pretrain, or this variable (=1) for every entry point and its child processes.
VERBOSE_ENV = "CPLM_VERBOSE"


def verbose() -> bool:
    """Whether start-up details are shown (CPLM_VERBOSE set to anything but empty or 0)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def set_verbose() -> None:
    """Show start-up details in this process and the processes it starts (`--verbose`)."""
    os.environ[VERBOSE_ENV] = "1"


def info(line: str) -> None:
    """A start-up detail: one line on stderr where verbose, nothing otherwise."""
    if verbose():
        print(line, file=sys.stderr, flush=True)

# Benign on machines without Apex/Transformer Engine (CPU, or a GPU image without TE): megatron-core
# announces its torch fallbacks at import time, once per module, in every process (shown where verbose).
_EXPECTED = (
    r".*(Apex|Transformer Engine).* (is|are) not installed.*",
    r".*Transformer Engine and Apex are not installed.*",
    r"full scope is deprecated.*",  # megatron-core's own TransformerConfig default (cuda graphs, unused)
    r"MimoModelConfig is experimental.*",  # megatron-core >= 0.19 at import; we build no MIMO model
    # torch.distributed.checkpoint, when a checkpoint is read in one process (evaluation, conversion; the newest
    # megatron-core reads the common state that way): the intended case, and the call order is megatron-core's
    r".*assuming the intent is to load in a single process.*",
    r"The argument order of load has been changed.*",
)
# torch's deprecations of what megatron-core's checkpoint loading calls (torch.distributed.checkpoint's
# load_state_dict, ShardedTensor): megatron-core's to act on, not a user's
_EXPECTED_FUTURE = (
    r"`load_state_dict` is deprecated and will be removed in future versions.*",
    r"Please use DTensor instead and we are deprecating ShardedTensor.*",
)
# megatron-core >= 0.19 logs this (rank 0) from every GPTModel built: each PP/VPP chunk, each model a process builds.
_GPT_DEPRECATION = "GPTModel IS DEPRECATED"
GPT_DEPRECATION_NOTE = (
    "[compat] GPTModel is deprecated in megatron-core {version} (bug fixes only; HybridModel replaces it): "
    "CPLMGPTModel still builds on it (setup.py: megatron-core < 0.20); how the head moves to HybridModel: "
    "docs/design.md"
)
_gpt_deprecation_shown = False
# megatron-core >= 0.19.3's checkpoint writer logs (no handler: Python's last-resort one prints WARNING and above)
# what it then raises or what the launch already settled: its own async save (we use it; NVRx is not installed) is
# deprecated, once per process; a failed write is logged before it is raised (the raised error is our one line, or
# its traceback where it is not a disk's). Shown where verbose.
_MCORE_CHECKPOINT_LOGS = {
    "megatron.core.dist_checkpointing.strategies.torch": "MCore's async save is deprecated",
    "megatron.core.dist_checkpointing.strategies.filesystem_async": "An error is caught while starting worker",
}


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

        info(GPT_DEPRECATION_NOTE.format(version=metadata.version("megatron-core")))
    return False


def quiet_known_warnings() -> None:
    """Hide megatron-core's expected 'Apex/TE not installed' warnings (call before importing megatron; shown where
    verbose); its per-model GPTModel deprecation log (>= 0.19) becomes one `[compat]` line per process where
    verbose, none otherwise; megatron-core's known checkpoint-writer logs (_MCORE_CHECKPOINT_LOGS) likewise."""
    if not verbose():
        for pattern in _EXPECTED:
            warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
        for pattern in _EXPECTED_FUTURE:
            warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)
    gpt_logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    if _gpt_deprecation_once not in gpt_logger.filters:
        gpt_logger.addFilter(_gpt_deprecation_once)
    if not verbose():
        for name in _MCORE_CHECKPOINT_LOGS:
            checkpoint_logger = logging.getLogger(name)
            if _known_checkpoint_log not in checkpoint_logger.filters:
                checkpoint_logger.addFilter(_known_checkpoint_log)


def _known_checkpoint_log(record: logging.LogRecord) -> bool:
    """Logging filter: drops megatron-core's checkpoint-writer records listed in _MCORE_CHECKPOINT_LOGS."""
    return _MCORE_CHECKPOINT_LOGS.get(record.name, "\0") not in record.getMessage()


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
