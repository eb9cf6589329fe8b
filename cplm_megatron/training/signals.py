"""Graceful stop on SIGTERM/SIGUSR1/SIGINT/SIGHUP/SIGQUIT: checkpoint at the next step boundary, exit with
RESUME_EXIT_CODE.

SLURM sends USR1 ahead of the time limit (`--signal=B:USR1@...`, forwarded by slurm/launch.sh) and TERM
on preemption/scancel; Ctrl-C is SIGINT (a terminal sends it to every process of the job: the python
process, or torchrun and its workers); a closed terminal or ssh session sends HUP, Ctrl-\\ sends QUIT. A worker
started by torchrun, or by a study's launcher (WATCH_LAUNCHER_ENV set), watches its launcher: when it is gone (killed
with -9), the worker stops as on SIGTERM instead of training on alone. A second stop signal, arriving more than
`REPEAT_AFTER_S` after the first (a launcher forwarding the same Ctrl-C is not a second one), stops the process at once
(exit 128 + the signal: the work since the last checkpoint is lost). The handler only records the signal;
`StopSignal.requested()` agrees on it across all ranks (a MAX all-reduce), so every rank saves and exits on
the same step. Entry points
call `defer_stop_signals()` first, so a signal during start-up waits for the handler instead of
killing the process (it returns the previous mask, for an in-process caller to restore).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Optional

from cplm_megatron.checkpoint.orphan_watchdog import STOP_SIGNALS  # noqa: F401 - the run's stop signals

# sysexits.h EX_TEMPFAIL: "temporary failure; the user is invited to retry". Launchers requeue on it.
RESUME_EXIT_CODE = 75
IGNORED_IF_IGNORED = (signal.SIGHUP, signal.SIGQUIT)  # left ignored when the process starts with them ignored
LAUNCHER_POLL_S = 1.0  # how often a torchrun worker checks that torchrun is still its parent
# A signal this long after the first is a second request (stop now); earlier ones are the same request
# arriving twice (a Ctrl-C reaches the workers from the terminal and again from torchrun).
REPEAT_AFTER_S = 1.0
# Set by a launcher whose jobs must not outlive it (experiments/launch): the parent process is watched as torchrun is
WATCH_LAUNCHER_ENV = "CPLM_WATCH_LAUNCHER"


def defer_stop_signals() -> set:
    """Block the stop signals until `StopSignal` installs its handlers (it unblocks them): a signal that
    arrives while the process starts up then stops the run at its first step boundary instead of killing it
    (call first thing in an entry point; the main thread's mask is inherited by threads started later)."""
    return signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))


def _start_resource_tracker_without(signals) -> None:
    """SLURM signals every process of a step; multiprocessing's resource tracker (used by streaming's
    shared memory) would die of SIGUSR1 and spam KeyErrors. Start it now with those signals blocked
    (a blocked mask is inherited), so it ignores them for the rest of the run. Its UserWarning about the
    shared memory it cleans after a run stopped at once (a second Ctrl-C) is left out: nothing is left to do."""
    from multiprocessing import resource_tracker

    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    sys.warnoptions.append("ignore::UserWarning")  # passed to the tracker's interpreter as -W
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions.remove("ignore::UserWarning")
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class StopSignal:
    """Installs the handlers; remembers the first signal received."""

    SIGNALS = STOP_SIGNALS

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self.boundaries = 0  # step boundaries reached (calls of `requested`)
        self._received_at = 0.0
        self._restored = False
        self._previous = {}
        for sig in self.SIGNALS:  # first: starting the resource tracker unblocks SIGINT/SIGTERM (multiprocessing)
            if sig in IGNORED_IF_IGNORED and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started with `nohup` (or in the background of a script): the user asked to ignore it
            self._previous[sig] = signal.signal(sig, self._handle)
        _start_resource_tracker_without(self.SIGNALS)
        _ACTIVE[:] = [self]
        self._watching = threading.Event()
        self._arrivals = _Arrivals(set(self._previous))  # before the unblock: a deferred signal arrives there
        launcher = "torchrun" if os.environ.get("TORCHELASTIC_RUN_ID") else (  # torchrun is the parent
            "the launcher" if os.environ.get(WATCH_LAUNCHER_ENV) else None)
        if launcher:
            threading.Thread(target=self._watch_launcher, args=(os.getppid(), launcher), name="launcher-watch",
                             daemon=True).start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self.SIGNALS))  # deferred ones are delivered now

    def _watch_launcher(self, launcher: int, name: str = "torchrun") -> None:
        """A worker whose launcher died (kill -9 of torchrun; a study runner's forkserver) is reparented: stop as on
        SIGTERM (checkpoint, 75) once training runs; before its first step (the process group may wait forever for
        torchrun's rendezvous store), exit at once with the resume code: nothing of this launch is lost."""
        while not self._watching.wait(LAUNCHER_POLL_S):
            if os.getppid() == launcher:
                continue
            if not self.boundaries:
                print(f"[train] {name} (pid {launcher}) is gone before the first step: exiting "
                      f"{RESUME_EXIT_CODE} (relaunch to resume)", file=sys.stderr, flush=True)
                kill_descendants()
                os._exit(RESUME_EXIT_CODE)
            if self.received is None:  # else a stop is under way already (torchrun's own SIGTERM): not a second one
                print(f"[train] {name} (pid {launcher}) is gone: stopping as on SIGTERM", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def _handle(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signum, now
            if signum == signal.SIGINT:
                print(f"[train] {signal.Signals(signum).name}: saving a checkpoint at the next step boundary, then "
                      f"exit {RESUME_EXIT_CODE}; press Ctrl-C again to stop at once (losing the work since the "
                      f"last checkpoint)", file=sys.stderr, flush=True)
            return
        if self._arrivals.running:  # it times the signals as they arrive, and stops the process itself
            return
        if now - self._received_at > REPEAT_AFTER_S:
            lost = "its checkpoint is saved" if self._restored else "without a checkpoint"
            print(f"[train] {signal.Signals(signum).name} again: stopping now, {lost}", file=sys.stderr, flush=True)
            kill_descendants()
            os._exit(128 + signum)

    def requested(self) -> bool:
        """Collective: True on every rank if any rank received a signal."""
        import torch
        import torch.distributed as dist

        self.boundaries += 1
        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        if dist.is_initialized():
            backend = dist.get_backend()
            if backend == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        """Give the previous handlers back; after a stop (its checkpoint saved, the process on its way out) keep
        this one, so that a second signal during the exit still stops the process at once with 128 + the signal."""
        self._watching.set()
        self._arrivals.close()
        self._restored = True
        if _ACTIVE == [self]:
            _ACTIVE.clear()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if self.received is None else self._handle)


class _Arrivals:
    """Times the stop signals as they arrive (a thread reading the interpreter's wakeup fd) and stops the process at
    once on one more than REPEAT_AFTER_S after the first. Python runs a handler only when the main thread is between
    bytecodes: after a long wait (an async save's shutdown) a SIGTERM and a Ctrl-C 1.5 s apart were handled
    together, SIGINT first (pending signals run by number), and counted as one request."""

    def __init__(self, signals: set):
        self.signals, self.first_at, self.running = signals, None, False
        self._closed = threading.Event()
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: the handler's own timing
            os.close(self._read)
            os.close(write)
            return
        self._write, self.running = write, True
        _reset_wakeup_fd_in_children()
        threading.Thread(target=self._watch, name="stop-signal-arrivals", daemon=True).start()

    def _watch(self) -> None:
        import select

        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)  # while the main thread blocks them (a save)
        ready = select.poll()
        ready.register(self._read, select.POLLIN)
        while not self._closed.is_set():
            if not ready.poll(250):
                continue
            data, now = os.read(self._read, 64), time.monotonic()
            for signum in (n for n in data if n in self.signals):
                if self.first_at is None:
                    self.first_at = now
                elif now - self.first_at > REPEAT_AFTER_S:
                    print(f"[train] {signal.Signals(signum).name} again: stopping now, without a checkpoint",
                          file=sys.stderr, flush=True)
                    kill_descendants()
                    os._exit(128 + signum)
        os.close(self._read)

    def close(self) -> None:
        """Give the wakeup fd back (main thread); the thread ends."""
        if self.running:
            self.running = False
            signal.set_wakeup_fd(self._previous_fd)
            self._closed.set()
            os.close(self._write)  # the thread's poll wakes up (end of file) and ends


def _reset_wakeup_fd_in_children() -> None:
    """A forked helper (a data worker, an async writer) must not write its signals into this process's wakeup fd."""
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_forget_arrivals)
        _FORK_HOOK.append(True)


def _forget_arrivals() -> None:
    """In a forked child: no wakeup fd, and its copy of the handler times its signals itself (no thread reads)."""
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        return
    for stop in _ACTIVE:
        stop._arrivals.running = False


_FORK_HOOK: list = []
_ACTIVE: list = []  # the process's installed StopSignal, if any


def stop_received() -> Optional[int]:
    """The stop signal this process received (None: none, or no StopSignal installed): for waits outside the
    training loop that must end promptly on a stop (the data layer's dataset lock)."""
    return _ACTIVE[0].received if _ACTIVE else None


def kill_descendants(timeout: float = 5.0) -> None:
    """SIGKILL this process's helper processes (async checkpoint writers and their Manager, data workers) so a
    failing trainer leaves no orphan behind; multiprocessing's resource tracker is spared: it removes the
    shared memory they leave when this process exits."""
    try:
        import psutil
    except ImportError:
        return
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    victims = []
    for child in children:
        try:
            if any("resource_tracker" in part for part in child.cmdline()):
                continue
            child.kill()
            victims.append(child)
        except psutil.Error:
            continue
    psutil.wait_procs(victims, timeout=timeout)
