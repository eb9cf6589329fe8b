"""Where checkpoints are written: the checkpoint dir is writable and has room for a save (checked before a launch
builds anything), and a save that failed for lack of space or permission explained in one line naming the fix
(the previous checkpoint is intact)."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from cplm_megatron.errors import CheckpointError

GIB = 1024**3


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def check_writable(path: Path, what: str) -> None:
    """`path` (created later if missing) can be written: a file is created and removed in it, or in the
    nearest existing parent (root ignores permission bits, so a real write is the only reliable test)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{what} {path} exists and is not a directory; remove it or choose another run.dir")
    where = _existing_ancestor(path)
    if not where.is_dir():
        raise CheckpointError(f"{what} {path} cannot be created: {where} is not a directory; choose another run.dir")
    try:
        fd, probe = tempfile.mkstemp(prefix=".cplm-write-test-", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CheckpointError(f"{what} {path} is not writable ({where}: {e.strerror or e}); fix its permissions "
                              f"or mount, or choose another run.dir") from None


def format_bytes(n: float) -> str:
    """'1.50 GiB', '12.0 MiB', '512 B'."""
    for unit, size in (("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def check_free_space(ckpt_dir: Path, needed: float, reclaimed: float = 0.0) -> None:
    """Room for two checkpoints of `needed` bytes on `ckpt_dir`'s filesystem (`reclaimed`: bytes this launch
    deletes before saving, e.g. checkpoint.overwrite=true)."""
    where = _existing_ancestor(ckpt_dir)
    free = shutil.disk_usage(where).free + reclaimed
    if free < 2 * needed:
        raise CheckpointError(
            f"not enough disk space for checkpoints in {ckpt_dir}: {format_bytes(free)} free on {where}'s "
            f"filesystem, one checkpoint needs ~{format_bytes(needed)} (planner, tools/model_info.py) and a save "
            f"needs room for two (the new one beside the previous); free space, point run.dir at a larger "
            f"filesystem, or set checkpoint.enabled=false")


def save_failure_message(ckpt_dir: Path, needed: float, error: BaseException) -> Optional[str]:
    """A save's failure explained as a full disk or an unwritable checkpoint dir (None: neither)."""
    where = _existing_ancestor(ckpt_dir)
    free = shutil.disk_usage(where).free
    text = " ".join(_error_texts(error))
    codes = {getattr(e, "errno", None) for e in _error_chain(error)}
    full = (codes & {errno.ENOSPC, errno.EDQUOT} or "No space left on device" in text
            or "Disk quota exceeded" in text or free < needed)
    if full:
        return (f"saving a checkpoint in {ckpt_dir} failed: the disk is full ({format_bytes(free)} free on {where}'s "
                f"filesystem, a checkpoint needs ~{format_bytes(needed)}; {_first_line(error)}); the previous "
                f"checkpoint is intact: free space and relaunch to resume from it")
    if codes & {errno.EACCES, errno.EPERM, errno.EROFS} or "Permission denied" in text or "Read-only file" in text:
        return (f"saving a checkpoint in {ckpt_dir} failed: it is no longer writable ({_first_line(error)}); the "
                f"previous checkpoint is intact: fix its permissions or mount and relaunch to resume from it")
    return None


def _error_chain(error: BaseException) -> list:
    """An exception, the ones it was raised from, and the per-rank failures torch's CheckpointException wraps."""
    chain, seen, todo = [], set(), [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        chain.append(e)
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return [e for e in chain if isinstance(e, BaseException)]


def _error_texts(error: BaseException) -> list:
    """The messages of `_error_chain(error)`."""
    return [str(e) for e in _error_chain(error)]


def _first_line(error: BaseException) -> str:
    """The line of an exception (or of the worker's error it wraps) that names what failed."""
    lines = [line.strip() for text in _error_texts(error) for line in text.splitlines() if line.strip()]
    for line in lines:
        if "No space left" in line or "quota" in line.lower():
            return line
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
