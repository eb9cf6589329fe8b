"""Graceful stop on SIGTERM/SIGUSR1: checkpoint at the next step boundary, exit with RESUME_EXIT_CODE.

SLURM sends USR1 ahead of the time limit (`--signal=B:USR1@...`, forwarded by slurm/launch.sh) and TERM
on preemption/scancel. The handler only records the signal; `StopSignal.requested()` agrees on it
across all ranks (a MAX all-reduce), so every rank saves and exits on the same step. Entry points
call `defer_stop_signals()` first, so a signal during start-up waits for the handler instead of
killing the process.
"""
from __future__ import annotations

import signal
from typing import Optional

# sysexits.h EX_TEMPFAIL: "temporary failure; the user is invited to retry". Launchers requeue on it.
RESUME_EXIT_CODE = 75
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def defer_stop_signals() -> None:
    """Block the stop signals until `StopSignal` installs its handlers (it unblocks them): a signal that
    arrives while the process starts up then stops the run at its first step boundary instead of killing it
    (call first thing in an entry point; the main thread's mask is inherited by threads started later)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))


def _start_resource_tracker_without(signals) -> None:
    """SLURM signals every process of a step; multiprocessing's resource tracker (used by streaming's
    shared memory) would die of SIGUSR1 and spam KeyErrors. Start it now with those signals blocked
    (a blocked mask is inherited), so it ignores them for the rest of the run."""
    from multiprocessing import resource_tracker

    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class StopSignal:
    """Installs the handlers; remembers the first signal received."""

    SIGNALS = STOP_SIGNALS

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous = {}
        _start_resource_tracker_without(self.SIGNALS)
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self.SIGNALS))  # deferred ones are delivered now

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        if self.received is None:
            self.received = signum

    def requested(self) -> bool:
        """Collective: True on every rank if any rank received a signal."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        if dist.is_initialized():
            backend = dist.get_backend()
            if backend == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
