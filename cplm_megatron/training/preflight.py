"""Checks of the machine a launch runs on, before anything is built or written: the run dir and the
checkpoint dir are writable, their filesystem has room for two checkpoints (the planner's size: the new
save is written beside the previous one), and the planner's memory estimate (tools/model_info.py) fits the
device (GPU) or the host's available memory (CPU). Each refusal is a UserError naming the figures and the fix.
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from cplm_megatron.errors import CheckpointError, ConfigError
from cplm_megatron.model.accounting import GIB, CopyHeadShape, checkpoint_bytes, memory_estimate
from cplm_megatron.training.run_config import RunConfig


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


def checkpoint_size(cfg: RunConfig) -> float:
    """The planner's size of one of this run's checkpoints (bytes)."""
    copy = CopyHeadShape.of(cfg.copy_head)
    return checkpoint_bytes(cfg.model, copy, 2 if cfg.precision.dtype == "bf16" else 4)


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


MEMORY_KEYS = ("train.micro_batch", "train.seq_len", "recompute.granularity=full", "optimizer.distributed=true",
               "parallel.tp", "parallel.pp", "model.lm_head_loss=chunked", "precision.dtype=bf16")


def memory_needed(cfg: RunConfig, dp: int) -> float:
    """The planner's memory per process (bytes): tools/model_info.py's estimate for this config and layout."""
    copy = CopyHeadShape.of(cfg.copy_head)
    p = cfg.parallel
    est = memory_estimate(cfg.model, copy, tp=p.tp, pp=p.pp, dp=dp, seq_len=cfg.train.seq_len,
                          micro_batch=cfg.train.micro_batch, sp=p.sp,
                          param_bytes=2 if cfg.precision.dtype == "bf16" else 4,
                          recompute=cfg.recompute.granularity, lm_head_loss=cfg.model.lm_head_loss,
                          offload_fraction=cfg.optimizer.offload_fraction)
    key = "total_distributed_optimizer_gib" if cfg.optimizer.distributed else "total_gib"
    return float(est[key]) * GIB


def available_memory(local_processes: int) -> tuple[float, str]:
    """(bytes one process may use, what that is): the GPU's total memory, or the host's available memory
    shared by the processes on this node."""
    import torch

    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        props = torch.cuda.get_device_properties(index)
        return float(props.total_memory), f"GPU {index} ({props.name}) has {format_bytes(props.total_memory)}"
    import psutil

    avail = psutil.virtual_memory().available
    share = avail / max(1, local_processes)
    per = f", {format_bytes(share)} for each of {local_processes} processes" if local_processes > 1 else ""
    return float(share), f"the host has {format_bytes(avail)} available{per}"


def check_memory(cfg: RunConfig, dp: int, local_processes: int) -> None:
    """Refuse a model the planner says cannot fit (run.check_memory=false skips the check)."""
    if not cfg.run.check_memory:
        return
    needed = memory_needed(cfg, dp)
    have, what = available_memory(local_processes)
    if needed > have:
        raise ConfigError(
            f"the model does not fit: the planner (tools/model_info.py) estimates {format_bytes(needed)} per "
            f"process, {what}; reduce it with {', '.join(MEMORY_KEYS)} (tools/model_info.py --plan lists layouts "
            f"that fit), a smaller model.preset, or skip this check with --set run.check_memory=false")


def preflight(cfg: RunConfig, dp: int, local_processes: int, reclaimed: float = 0.0) -> None:
    """Every machine check of a launch, in the order a user fixes them."""
    run_dir = Path(cfg.run.dir)
    check_writable(run_dir, "run.dir")
    if cfg.checkpoint.enabled:
        check_writable(run_dir / "checkpoints", "checkpoint dir")
        check_free_space(run_dir / "checkpoints", checkpoint_size(cfg), reclaimed)
    check_memory(cfg, dp, local_processes)
