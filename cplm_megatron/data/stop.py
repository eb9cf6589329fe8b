"""Stopping a data-layer wait on a stop signal: the data layer cannot see the trainer's signal handler (it sits
below training), so the entry point hands it a check (`set_stop_check`); a wait that must end promptly (the
machine's dataset lock, held for minutes by another job) asks `stop_signal()` and raises StopRequested."""
from __future__ import annotations

from typing import Callable, Optional

_STOP_CHECK: list = []  # the entry point's `() -> signal number or None` (the trainer's StopSignal), if set


class StopRequested(Exception):
    """A stop signal arrived while this process waited to open its datasets (nothing is trained or written yet)."""


def set_stop_check(check: Optional[Callable[[], Optional[int]]]) -> None:
    """Make data-layer waits end on a stop signal: `check()` returns the signal received, or None."""
    _STOP_CHECK[:] = [check] if check is not None else []


def stop_signal() -> Optional[int]:
    """The stop signal the entry point received (None: none, or no check set)."""
    return _STOP_CHECK[0]() if _STOP_CHECK else None
