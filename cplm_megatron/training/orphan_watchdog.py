"""No orphans: a tiny watchdog process (a bare interpreter, no torch) that follows the trainer's helper processes
(megatron's async-writer Manager, the writers) and SIGKILLs them when the trainer dies, whatever killed it
(kill -9, os._exit, the OOM killer); multiprocessing's resource tracker is spared (it cleans shared memory)."""
from __future__ import annotations

import os
import subprocess
import sys

_WATCH = r'''
import os, sys, time
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
known = {}
while os.getppid() == trainer:
    for pid, start in descendants():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"resource_tracker" not in cmd:
            known[pid] = start
    time.sleep(0.5)
for pid, start in known.items():
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19] == start:
            os.kill(pid, 9)
    except (OSError, IndexError):
        pass
'''


def start_orphan_watchdog() -> subprocess.Popen:
    """Start the watchdog of this process's helpers (it exits by itself when this process does)."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH, str(os.getpid())], stdin=subprocess.DEVNULL,
                            close_fds=True)
