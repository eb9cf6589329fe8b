"""One run per run dir: RUN_DIR/run.lock, holding the holder's host, pid, job id and start time; its mtime is the
heartbeat (touched every HEARTBEAT_S). The record is written whole to a file of this launch's own and then
hard-linked to run.lock (link fails if run.lock exists, atomically, on local and shared filesystems), so a lock is
never visible before its record is complete. A lock is stale when its holder is gone (the same SLURM job id: a
requeued job's previous incarnation, on any node; same host: the pid is dead or is another process now; another
host: no heartbeat for STALE_AFTER_S) and is then taken over; a live one refuses the launch. An empty or partial
lock (a filesystem without hard links, where the lock is created and then written, or a writer that died
mid-write) is live until it is STALE_AFTER_S old.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from cplm_megatron.errors import ConfigError

LOCK_NAME = "run.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0


def _process_start(pid: int) -> Optional[str]:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _holder_record() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid()),
            "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID"), "since": time.time()}


def _stale_reason(record: dict, age_s: float) -> Optional[str]:
    """Why the holder in `record` is gone (None: it may be alive)."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and record.get("job_id") == job and (record.get("host"), record.get("pid")) != (socket.gethostname(),
                                                                                             os.getpid()):
        # SLURM restarts a requeued job (same id) only after its previous incarnation ended, on any node
        return f"it is this SLURM job's previous incarnation (job {job}, requeued)"
    if record.get("host") == socket.gethostname():
        if record.get("pid") == os.getpid():
            return "this process held it (an earlier in-process launch)"
        if _process_start(int(record.get("pid", -1))) != record.get("start"):
            return f"pid {record.get('pid')} is no longer running"
        return None
    if age_s > STALE_AFTER_S:
        return f"no heartbeat for {age_s:.0f} s"
    return None


class RunLock:
    """The run dir's lock, held by rank 0 of a launch from `acquire` to `release`."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._record: Optional[dict] = None
        self._created_dir = False

    def acquire(self) -> Optional[str]:
        """Take the lock; returns a note when a stale one was taken over; raises ConfigError if a live run holds it."""
        if self.path.is_dir() or (self.path.exists() and not self.path.is_file()):
            raise ConfigError(f"{self.path} is not a lock file (a directory or a special file); remove it if no run "
                              f"uses {self.path.parent}, then relaunch")
        self._created_dir = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        note = None
        for _ in range(3):
            record = _holder_record()
            if not self._publish(record):
                note = self._take_over_if_stale()
                continue
            self._record = record
            self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
            self._thread.start()
            return note
        raise ConfigError(f"could not take {self.path}: other launches keep taking it; launch one run per run.dir")

    def _publish(self, record: dict) -> bool:
        """Make `record` the lock, complete from the moment it is visible (False: a lock exists)."""
        text = json.dumps(record)
        tmp = self.path.with_name(f"{LOCK_NAME}.{socket.gethostname()}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            except OSError:  # a filesystem without hard links: create exclusively, then write (see the module doc)
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    return False
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                return True
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over_if_stale(self) -> str:
        try:
            text, age = self.path.read_text(), time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return ""
        try:
            record = json.loads(text)
        except ValueError:
            record = {}
        if not isinstance(record, dict):
            record = {}
        if not record and age <= STALE_AFTER_S:
            raise ConfigError(
                f"{self.path} is {'empty' if not text.strip() else 'partial'} and {age:.0f} s old: another launch may "
                f"be writing it; wait for it, or choose another run.dir (a lock without a record is taken over "
                f"once it is {STALE_AFTER_S:.0f} s old)")
        reason = _stale_reason(record, age) if record else f"it holds no record and is {age:.0f} s old"
        if reason is None:
            raise ConfigError(
                f"run.dir {self.path.parent} is in use by a live run (host {record.get('host')}, pid "
                f"{record.get('pid')}, job {record.get('job_id') or 'none'}, heartbeat {age:.0f} s ago); wait for it "
                f"to finish or stop it, or choose another run.dir (a lock stays {STALE_AFTER_S:.0f} s after its "
                f"holder on another host stops; delete {self.path} only if that run is surely gone)")
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}")
        try:
            os.rename(self.path, aside)  # one of several racing launches wins the stale file
        except FileNotFoundError:
            return ""
        if aside.read_text() != text:  # a racing launch's fresh lock, renamed after it replaced the stale one
            try:
                os.link(aside, self.path)
            finally:
                os.unlink(aside)
            return ""
        os.unlink(aside)
        return (f"[run] took over {self.path} from host {record.get('host')} pid {record.get('pid')} job "
                f"{record.get('job_id') or 'none'}: {reason}")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this launch's."""
        self._stop.set()
        if self._record is None:
            return
        try:
            if json.loads(self.path.read_text()) == self._record:
                self.path.unlink()
        except (OSError, ValueError):
            pass
        self._record = None
        if self._created_dir:  # a launch refused after taking the lock leaves no new run dir behind
            try:
                self.path.parent.rmdir()
            except OSError:  # not empty: the run wrote into it
                pass
