"""Checks of the machine a launch runs on, before anything is built or written: the run dir and the
checkpoint dir are writable, their filesystem has room for two checkpoints (the planner's size: the new
save is written beside the previous one) and the file-size limit (`ulimit -f`) can hold a save's files, and the
planner's memory estimate (tools/model_info.py) fits the device (GPU) or the host's available memory (CPU). Each
refusal is a UserError naming the figures and the fix. `range_notes`: the cadences a launch never reaches (warned).
"""
from __future__ import annotations

import os
from pathlib import Path

from cplm_megatron.checkpoint.storage import check_file_size_limit, check_free_space, check_writable, format_bytes
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.sizing.accounting import GIB, CopyHeadShape, checkpoint_bytes, memory_estimate
from cplm_megatron.run_config import RunConfig


def checkpoint_size(cfg: RunConfig) -> float:
    """The planner's size of one of this run's checkpoints (bytes)."""
    copy = CopyHeadShape.of(cfg.copy_head)
    return checkpoint_bytes(cfg.model, copy, 2 if cfg.precision.dtype == "bf16" else 4)


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
                          offload_fraction=cfg.optimizer.offload_fraction, cp=p.cp,
                          attention="sdpa" if cfg.model.attention_impl == "auto" else cfg.model.attention_impl,
                          document_masking=cfg.data.document_masking)
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
        p = cfg.parallel
        check_file_size_limit(run_dir / "checkpoints", checkpoint_size(cfg), dp * p.tp * p.pp * p.cp)
    check_memory(cfg, dp, local_processes)


def _never_due(interval: int, start: int, total: int) -> bool:
    """Whether a cadence of `interval` iterations (0: off) has no multiple in this launch's (start, total]."""
    return interval > 0 and (start // interval + 1) * interval > total


def range_notes(cfg: RunConfig, start: int = 0) -> list:
    """One line for each cadence this launch (iterations start+1..total) never reaches, and each probe length the
    run cannot give (`_probe_notes`). Warned, not refused: a recipe's intervals are set for its full length, and a
    shorter run (train.iters=N, a resumed launch's last iterations) loses nothing by them. Profile steps past the
    run's end are refused with the config."""
    t, total, notes = cfg.train, cfg.train.total_iters(), []
    if start >= total:  # nothing to train (a finished run relaunched)
        return notes
    until = f"iterations {start + 1}..{total}" if start else f"{total} iterations"
    if cfg.data.val_streams and _never_due(t.eval_interval, start, total):
        notes.append(f"[config] train.eval_interval={t.eval_interval}: no validation in this launch's {until} "
                     f"(set train.eval_interval <= {total - start} to validate, 0 to say none)")
    if _never_due(t.probe_interval, start, total):
        notes.append(f"[config] train.probe_interval={t.probe_interval}: no probe in this launch's {until}"
                     f"{' after the one before the first step' if not start else ''}")
    if cfg.checkpoint.enabled and _never_due(cfg.checkpoint.interval, start, total):
        notes.append(f"[config] checkpoint.interval={cfg.checkpoint.interval}: no periodic checkpoint in this "
                     f"launch's {until}; it saves at the end (and on a stop signal)")
    if t.profile_steps and start >= t.profile_steps[0]:
        left = f"only {start + 1}..{t.profile_steps[1]} profiled" if start < t.profile_steps[1] else "nothing profiled"
        notes.append(f"[config] train.profile_steps={list(t.profile_steps)}: this launch resumes at iteration "
                     f"{start}, {left}")
    return notes + (_probe_notes(cfg) if t.probe_interval else [])


def _probe_notes(cfg: RunConfig) -> list:
    """The probe's lengths against the model's and the data's (evaluation/probes.py takes what fits, silently)."""
    t, most = cfg.train, cfg.model.max_position_embeddings
    notes, length = [], min(t.probe_copy_length, most)
    if t.probe_copy_length > most:
        notes.append(f"[config] train.probe_copy_length={t.probe_copy_length} is past "
                     f"model.max_position_embeddings={most}: the probes use {most} tokens")
    if cfg.data.val_streams and length // 2 > t.seq_len:
        notes.append(f"[config] train.probe_copy_length={length}: no text-copy figure (its spans of {length // 2} "
                     f"tokens cannot come from validation rows of train.seq_len={t.seq_len}; set "
                     f"train.probe_copy_length <= {2 * t.seq_len})")
    return notes
