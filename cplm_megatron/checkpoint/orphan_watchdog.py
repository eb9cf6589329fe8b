"""No orphans: a tiny watchdog process (a bare interpreter, no torch) that follows the trainer's helper processes
(megatron's Manager, spawned by the first checkpoint save, sync or async, the async writers, the data workers) and
SIGKILLs them when the trainer dies, whatever killed it (kill -9, os._exit, the OOM killer); multiprocessing's
resource tracker is spared: it cleans the shared memory and exits once the last process holding it is gone.

One watchdog per process (`ensure_orphan_watchdog`); it rescans at once when told (`notice`: after a save started
a helper), else every half second, and exits by itself when the trainer does."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Optional

_WATCH = r'''
import os, select, sys, time
trainer, me = int(sys.argv[1]), os.getpid()
def children():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
                kids.setdefault(int(stat[1]), []).append((int(d), stat[19]))
            except OSError:
                pass
    return kids
def descendants():
    kids, found, todo = children(), [], [trainer]
    while todo:
        for pid, start in kids.get(todo.pop(), []):
            if pid != me:
                found.append((pid, start))
                todo.append(pid)
    return found
known, listening = {}, True
while os.getppid() == trainer:
    for pid, start in descendants():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            known[pid] = start
    if listening and select.select([sys.stdin], [], [], 0.5)[0]:
        listening = bool(os.read(0, 4096))  # a notice: rescan now; end of file: poll only
    else:
        time.sleep(0.0 if listening else 0.5)
for pid, start in known.items():
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19] == start:
            os.kill(pid, 9)
    except (OSError, IndexError):
        pass
'''
WATCHDOG_MARK = "cplm-orphan-watchdog"  # in the watchdog's command line (argv[2]): what the test suite spares
# The signals launchers and terminals send a run's whole process group: the trainer stops on them
# (training/signals.py), the watchdog blocks them (it must outlive its parent's stop, not die with it).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

_WATCHDOG: dict = {}  # pid of the watched process -> its watchdog


def start_orphan_watchdog() -> subprocess.Popen:
    """Start a watchdog of this process's helpers (it exits by itself when this process does). The stop signals are
    blocked in it (the mask survives exec): a Ctrl-C or a SIGTERM to the run's process group is the trainer's to
    handle, and must neither kill the watchdog nor print its KeyboardInterrupt."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH, str(os.getpid()), WATCHDOG_MARK],
                                stdin=subprocess.PIPE, close_fds=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextmanager
def stop_signals_blocked():
    """While the block runs, the stop signals are blocked in this thread, so a helper process it starts (megatron's
    Manager, spawned by the first save; an async writer, forked) inherits them blocked (the mask survives fork and
    exec): a Ctrl-C to the run's process group is the trainer's to handle, not a traceback from a helper. The
    trainer's own handlers still run (training/signals.py reads them in a thread that does not block them)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ensure_orphan_watchdog() -> subprocess.Popen:
    """This process's watchdog, started on first use (a forked child gets its own)."""
    watchdog: Optional[subprocess.Popen] = _WATCHDOG.get(os.getpid())
    if watchdog is None or watchdog.poll() is not None:
        watchdog = _WATCHDOG[os.getpid()] = start_orphan_watchdog()
    return watchdog


def notice() -> None:
    """Tell this process's watchdog (if any) to look for new helpers now (after a save started one)."""
    watchdog = _WATCHDOG.get(os.getpid())
    if watchdog is None or watchdog.stdin is None:
        return
    try:
        watchdog.stdin.write(b"\n")
        watchdog.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
