"""A mount namespace of the test's own, for the small-disk, full-disk and private-/dev/shm cases: a sleeping process
holds it (`unshare -m --propagation private`), tmpfs filesystems are mounted inside it (nobody else on the machine
sees them), trainers join it (`python tests/training/private_mounts.py HOLDER_PID SCRIPT ARGS...`: setns, then
SCRIPT as __main__), and the test reads what they wrote through /proc/HOLDER_PID/root. Needs root (CAP_SYS_ADMIN),
which the CI and development containers give."""
from __future__ import annotations

import ctypes
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

SCRIPT = Path(__file__).resolve()
CLONE_NEWNS = 0x00020000


class PrivateMounts:
    """The namespace, its holder process and what is mounted in it."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", "echo ready; exec sleep 3600"],
                                       stdout=subprocess.PIPE, text=True)
        if self.holder.stdout.readline() != "ready\n":
            self.close()
            raise RuntimeError("unshare -m failed: a private mount namespace needs root (CAP_SYS_ADMIN)")

    def run(self, *command: str) -> None:
        """A command inside the namespace (nsenter)."""
        subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", *command], check=True, capture_output=True)

    def tmpfs(self, directory: Path, size: str) -> Path:
        """A tmpfs of `size` (e.g. "30m") at `directory`, inside the namespace only; returns `directory`."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory))
        return Path(directory)

    def resize(self, directory: Path, size: str) -> None:
        """Grow (or shrink) the tmpfs at `directory`: space freed, as a user freeing a disk would."""
        self.run("mount", "-o", f"remount,size={size}", str(directory))

    def seen(self, path: Path) -> Path:
        """`path` as the namespace sees it, readable from outside (/proc/HOLDER/root/...)."""
        return Path(f"/proc/{self.holder.pid}/root") / Path(path).relative_to("/")

    def script(self, script: Path) -> list:
        """The leading arguments that run `script` inside the namespace (tests/harness.py `script=`)."""
        return [str(SCRIPT), str(self.holder.pid), str(script)]

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


def private_mounts() -> Iterator[PrivateMounts]:
    """A pytest fixture body: the namespace for one test."""
    mounts = PrivateMounts()
    try:
        yield mounts
    finally:
        mounts.close()


def enter(holder_pid: int) -> None:
    """Join the mount namespace of `holder_pid` (this process must be single-threaded: a forked or fresh one)."""
    fd = os.open(f"/proc/{holder_pid}/ns/mnt", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), f"setns into the mount namespace of {holder_pid}")
    finally:
        os.close(fd)


def main(argv: Optional[list] = None) -> None:
    holder, script, *args = sys.argv[1:] if argv is None else argv
    enter(int(holder))
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
