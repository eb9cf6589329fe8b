"""Where checkpoints are written: the checkpoint dir is writable, has room for a save and the process may write
files that large (`ulimit -f`; checked before a launch builds anything), and a save that failed for lack of space,
the file-size limit or permission explained in one line naming the fix (the previous checkpoint is intact)."""
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


# megatron-core's torch_dist writes each rank's shards in at most this many files (its save thread_count: 2 in
# 0.16, 1 in 0.19), so a save's largest file holds at least 1/(2 x ranks) of the checkpoint
FILES_PER_RANK = 2


def file_size_limit() -> Optional[int]:
    """This process's file-size limit in bytes (`ulimit -f`, RLIMIT_FSIZE); None when unlimited."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def check_file_size_limit(ckpt_dir: Path, needed: float, ranks: int) -> None:
    """The file-size limit can hold a save's files: refused when it is below the smallest the largest file of a
    save of `needed` bytes by `ranks` processes can be (with a 10% margin for the planner's estimate)."""
    limit = file_size_limit()
    files = FILES_PER_RANK * max(1, ranks)
    if limit is not None and limit < 0.9 * needed / files:
        raise CheckpointError(
            f"checkpoints cannot be written in {ckpt_dir}: this process's file-size limit ({format_bytes(limit)}, "
            f"ulimit -f) is below the ~{format_bytes(needed / files)} of a save's largest file (~"
            f"{format_bytes(needed)} a checkpoint, planner: tools/model_info.py); raise the limit (ulimit -f "
            f"unlimited) and relaunch, or set checkpoint.enabled=false")


def _file_at_limit(ckpt_dir: Path, limit: int) -> Optional[Path]:
    """A file of an unfinished save under `ckpt_dir` that reached the file-size limit (the write cut short)."""
    for save in Path(ckpt_dir).glob("iter_*"):
        if not save.is_dir() or (save / "cplm_state.json").exists():  # committed: written whole
            continue
        for file in save.iterdir():
            try:
                if file.is_file() and file.stat().st_size >= limit:
                    return file
            except OSError:
                continue
    return None


def _size_limit_message(ckpt_dir: Path, error: BaseException, codes: set, text: str) -> Optional[str]:
    """A save cut short by the file-size limit (EFBIG, or torch's zip writer's 'unexpected pos' with a file at
    the limit), explained; None otherwise."""
    limit = file_size_limit()
    if limit is None:
        return None
    file = _file_at_limit(ckpt_dir, limit)
    if file is None and errno.EFBIG not in codes and "File too large" not in text:
        return None
    return (f"saving a checkpoint in {ckpt_dir} failed: {file or 'a file'} reached this process's file-size limit "
            f"({format_bytes(limit)}, ulimit -f); the previous checkpoint is intact: raise the limit (ulimit -f "
            f"unlimited) and relaunch to resume from it")


def save_failure_message(ckpt_dir: Path, needed: float, error: BaseException) -> Optional[str]:
    """A save's failure explained as the file-size limit, a full disk or an unwritable checkpoint dir (None:
    none of them)."""
    where = _existing_ancestor(ckpt_dir)
    free = shutil.disk_usage(where).free
    text = " ".join(_error_texts(error))
    codes = {getattr(e, "errno", None) for e in error_chain(error)}
    limited = _size_limit_message(ckpt_dir, error, codes, text)
    if limited is not None:
        return limited
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


def error_chain(error: BaseException) -> list:
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
    """The messages of `error_chain(error)`."""
    return [str(e) for e in error_chain(error)]


def _first_line(error: BaseException) -> str:
    """The line of an exception (or of the worker's error it wraps) that names what failed."""
    lines = [line.strip() for text in _error_texts(error) for line in text.splitlines() if line.strip()]
    for line in lines:
        if "No space left" in line or "quota" in line.lower():
            return line
    return f"{type(error).__name__}: {lines[0] if lines else ''}"
