"""A /dev/shm the data loader cannot use (full, read-only) stops pretraining with one `error:` line and exit code 2
before anything is written (issue 30 item 4): each case runs pretrain in a warm process with its own mount namespace,
whose /dev/shm is a private tmpfs (the machine's is untouched)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import harness
from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.usefixtures("isolated_streaming")]

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REC, MS_PRIVATE = 1, 0x4000, 1 << 18
SHM_SIZE = 256 << 10


def _mount(libc: ctypes.CDLL, source: bytes | None, target: bytes, fstype: bytes | None, flags: int,
           data: bytes | None) -> None:
    """mount(2), raising OSError."""
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    if libc.mount(source, target, fstype, flags, data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target!r}: {os.strerror(errno)}")


def _pretrain_with_private_shm(rank: int, shm: str, argv: list[str]) -> None:
    """In a warm process: a private mount namespace whose /dev/shm is `shm` ('full' or 'read-only'), then
    pretrain's main(argv); its exit code is the process's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount(libc, None, b"/", None, MS_REC | MS_PRIVATE, None)  # nothing below propagates to the machine
    _mount(libc, b"tmpfs", b"/dev/shm", b"tmpfs", MS_RDONLY if shm == "read-only" else 0,
           f"size={SHM_SIZE}".encode())
    if shm == "full":
        try:
            with open("/dev/shm/filler", "wb") as f:
                f.write(b"x" * SHM_SIZE)
        except OSError:  # ENOSPC: full, as meant
            pass
    from cplm_megatron.pretrain import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@pytest.fixture(scope="module")
def mount_namespaces() -> None:
    """Private mount namespaces need root in a privileged container (the development and CI machines)."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
        pytest.skip("cannot create a private mount namespace here (needs root in a privileged container)")


@pytest.mark.usefixtures("mount_namespaces")
@pytest.mark.parametrize("shm, fragments", [
    ("full", ["/dev/shm is full (", "the data loader needs about", "--shm-size"]),
    ("read-only", ["cannot create files in /dev/shm (Read-only file system)", "mount -o remount,rw /dev/shm"]),
])
def test_an_unusable_dev_shm_is_one_line_and_exit_2(stdlib_corpus, tmp_path: Path, shm: str,
                                                     fragments: list[str]) -> None:
    """Full: streaming used to die writing its segments (a bare `Bus error`, exit 135); read-only: a 49-line
    traceback. Now one line naming /dev/shm and the fix, exit 2, and no run dir."""
    run_dir = tmp_path / "run"
    argv = harness.pretrain_args(pu.tiny_overrides(stdlib_corpus, run_dir, 2))
    out = harness.run_captured(_pretrain_with_private_shm, 1, shm, argv, timeout=300)
    proc = subprocess.CompletedProcess(argv, out.returncode, out.stdout, out.stderr)
    pu.assert_bad_input(proc, *fragments)
    assert not run_dir.exists()
