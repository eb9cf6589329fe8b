"""No test leaves a process behind (issue 43 item 5): every process a test session starts carries the session's mark
in its environment (set at start-up, inherited through subprocess, torchrun, multiprocessing and the warm forkserver,
and still readable in /proc/PID/environ after its parent died and it was reparented); at the end of the session the
ones still alive are reported with the test that was running when each started, killed, and fail the session.

The session's own helpers are spared: the warm forkserver, multiprocessing's resource trackers and spawned children
(a Manager megatron-core started for an in-process save), the trainer's orphan watchdog and pytest-xdist's workers
(each checks the processes of its own tests), while their parent is the session's own process (they exit with it)."""
from __future__ import annotations

import bisect
import os
import signal
import time
import uuid
from dataclasses import dataclass
from typing import List, Optional, Tuple

MARK = "CPLM_TEST_SESSION"
# the session's own multiprocessing children (the warm forkserver, resource trackers, a Manager that megatron-core
# spawned for an in-process checkpoint save) and the trainer's watchdog: spared while the session is their parent
HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker", b"multiprocessing.spawn",
           b"cplm-orphan-watchdog", b"import sys;exec(eval(sys.stdin.readline()))")  # the last: a pytest-xdist worker
KEPT_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd")  # CPLM_SLURM_KEEP=1 leaves the local cluster up


def mark_session() -> str:
    """Give this session its mark (every process started from now on inherits it)."""
    os.environ[MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return os.environ[MARK]


@dataclass(frozen=True)
class Survivor:
    pid: int
    parent: int
    started: float
    command: str


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int) -> Optional[Tuple[str, int, int]]:
    """(state, parent pid, start time in clock ticks since boot) of a process."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    fields = raw.rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _boot_time() -> float:
    for line in (_read("/proc/stat") or b"").splitlines():
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return 0.0


def survivors(mark: str, session_pid: int) -> List[Survivor]:
    """The live processes carrying `mark`, other than the session's process and its own helpers."""
    needle = f"{MARK}={mark}".encode()
    ticks, boot = os.sysconf("SC_CLK_TCK"), _boot_time()
    keep_daemons = os.environ.get("CPLM_SLURM_KEEP") == "1"
    found, helpers = [], set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (session_pid, os.getpid()):
            continue
        pid = int(name)
        environ, stat = _read(f"/proc/{pid}/environ"), _stat(pid)
        if environ is None or stat is None or needle not in environ.split(b"\0") or stat[0] == "Z":
            continue
        command = (_read(f"/proc/{pid}/cmdline") or b"").replace(b"\0", b" ").strip()
        if any(h in command for h in HELPERS) and stat[1] == session_pid:
            helpers.add(pid)
            continue
        if keep_daemons and os.path.basename(command.split(b" ")[0].decode(errors="replace")) in KEPT_DAEMONS:
            continue
        found.append(Survivor(pid, stat[1], boot + stat[2] / ticks, command.decode(errors="replace")[:300]))
    # the forkserver's own resource tracker is one of its helpers too
    return [s for s in found if not (s.parent in helpers and b"resource_tracker" in s.command.encode())]


class SessionProcesses:
    """The session-end check: `started(nodeid)` as each test starts, `check()` at the end."""

    def __init__(self) -> None:
        self.mark = mark_session()
        self.pid = os.getpid()
        self._starts: List[float] = []
        self._tests: List[str] = []

    def started(self, nodeid: str) -> None:
        self._starts.append(time.time())
        self._tests.append(nodeid)

    def _test_at(self, when: float) -> str:
        i = bisect.bisect_right(self._starts, when) - 1
        return self._tests[i] if i >= 0 else "(before the first test)"

    def check(self, grace_s: float = 10.0) -> List[str]:
        """The report lines of the processes still alive after `grace_s` (resource trackers exit a moment after the
        last process holding them); those processes are killed."""
        left = survivors(self.mark, self.pid)
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = survivors(self.mark, self.pid)
        lines = [f"pid {s.pid} (parent {s.parent}), started during {self._test_at(s.started)}: {s.command}"
                 for s in left]
        for s in left:
            try:
                os.kill(s.pid, signal.SIGKILL)
            except OSError:
                pass
        return lines
