"""The GPU study's training: the arms' overrides of the recipe, the CPLM trained within its time share and the
baseline for as many iterations, each arm's figures and probes read from its run files through the toolkit's readers
(training/run_record.py, training/metrics_log.py)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.gpu_study.record import Record, run_phase
from cplm_megatron.experiments.gpu_study.sizes import RECIPE, Sizes
from cplm_megatron.experiments.gpu_study.time_share import TimeShare
from cplm_megatron.training.metrics_log import read_metrics, record_nll
from cplm_megatron.training.run_record import RunRecord, read_run_record, run_record_path

PROBE_KEYS = ("probe_copy_accuracy", "probe_in_context_score", "probe_copy_chance")


def arm_dir(work: Path, arm: str) -> Path:
    """An arm's run dir: WORK/runs/study_<arm>."""
    return work / "runs" / f"study_{arm}"


def train_overrides(arm: str, sizes: Sizes, corpus: Path, run_dir: Path, vocab: int,
                    exit_after: int | None = None) -> list[str]:
    """The `--set` overrides of the recipe for one arm (the arms differ in the copy head, and the baseline stops at
    the CPLM's iteration count)."""
    model = [f"model.{k}={v}" for k, v in sizes.model.items()]
    out = [f"run.dir={run_dir}", "model.preset=tiny", *model, f"model.vocab_size={vocab}",
           f"model.max_position_embeddings={sizes.seq_len}", "model.attention_impl=sdpa", "model.lm_head_loss=auto",
           f"copy_head.enabled={'true' if arm == 'cplm' else 'false'}", f"data.streams=[{corpus / 'train'}]",
           f"data.val_streams=[{corpus / 'val'}]", "data.num_workers=2", "train.tokens=null",
           f"train.iters={sizes.max_iters}", f"train.seq_len={sizes.seq_len}", f"train.micro_batch={sizes.micro_batch}",
           f"train.global_batch={sizes.global_batch}", f"train.lr={sizes.lr}", f"train.min_lr={sizes.lr}",
           "schedule.style=constant", f"schedule.warmup_iters={sizes.warmup_iters}", "train.log_interval=10",
           f"train.eval_interval={sizes.max_iters}", f"train.eval_iters={sizes.probe_val_batches}",
           f"train.probe_interval={sizes.probe_interval}", f"train.probe_sequences={sizes.probe_sequences}",
           f"train.probe_copy_length={sizes.probe_copy_length}", f"checkpoint.interval={sizes.max_iters}",
           "checkpoint.keep=1", "checkpoint.async_save=false", "optimizer.distributed=false",
           "optimizer.overlap_grad_reduce=false", "optimizer.overlap_param_gather=false", "logging.wandb=false",
           "precision.dtype=bf16", "parallel.timeout_minutes=5"]
    return out + ([f"train.exit_after_iters={exit_after}"] if exit_after else [])


def launch_record(run_dir: Path) -> RunRecord | None:
    """The run record of the arm's launch: of a finished run, else of one stopped early (its time share); None when
    the trainer wrote neither."""
    found = run_record_path(run_dir) or run_record_path(run_dir, stopped_early=True)
    return read_run_record(found) if found else None


def final_train_loss(metrics: list[dict[str, Any]]) -> float | None:
    """The last logged training loss: the NLL of the output distribution (`record_nll`: the mixture's for the CPLM,
    the LM head's for the baseline; not the CPLM's objective), as validation reports it."""
    losses = [record_nll(r) for r in metrics if "loss" in r and "val_loss" not in r]
    return losses[-1] if losses else None


def probes(metrics: list[dict[str, Any]], tokens_per_step: int) -> list[dict[str, Any]]:
    """The run's probe records (metrics.jsonl), by iteration, with the tokens trained by then."""
    return [{"iteration": r["iteration"], "tokens": r["iteration"] * tokens_per_step, **{k: r.get(k) for k in PROBE_KEYS}}
            for r in metrics if "probe_copy_accuracy" in r]


def release_memory() -> None:
    """Free what the last trainer or scorer left on the GPU."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def stopped_by(share_fired: bool, launch: RunRecord | None, exit_after: int | None) -> str:
    """What ended an arm's training: its time share only when the run stopped early (a share that fires while a
    finished run exits ended nothing), else the CPLM's iteration count (the baseline) or the iteration cap."""
    if share_fired and (launch is None or launch.stopped_early):
        return "time share"
    return "the CPLM's iteration count" if exit_after else "iteration cap"


def train_arm(arm: str, work: Path, sizes: Sizes, corpus: Path, record: Record, seconds: float,
              exit_after: int | None = None) -> int:
    """One arm's training run (this process) within `seconds`; its figures and probes into the record; returns the
    iterations it trained."""
    from cplm_megatron.pretrain import main as pretrain

    vocab = record.data["corpus"]["vocab_size"]
    run_dir = arm_dir(work, arm)
    start = time.perf_counter()
    with TimeShare(seconds) as share:
        code = pretrain(["--config", RECIPE, "--set", *train_overrides(arm, sizes, corpus, run_dir, vocab, exit_after)])
    launch = launch_record(run_dir)
    metrics = read_metrics(run_dir)
    iterations = int(launch.iterations if launch else 0)
    record.data["arms"].setdefault(arm, {})["train"] = {
        "exit_code": code, "seconds": round(time.perf_counter() - start, 1), "time_share_s": round(seconds, 1),
        "stopped_by": stopped_by(share.fired, launch, exit_after),
        "iterations": iterations, "tokens": iterations * sizes.tokens_per_step,
        **{k: getattr(launch, k, None) for k in ("tokens_per_sec", "peak_memory_gib", "lm_head_loss")},
        "final_train_loss": final_train_loss(metrics)}
    record.data["arms"][arm]["probes"] = probes(metrics, sizes.tokens_per_step)
    release_memory()
    if code not in (0, 75) or not iterations:
        raise RuntimeError(f"training the {arm} arm exited {code} after {iterations} iterations")
    return iterations


def arm_share(sizes: Sizes, deadline: float) -> float:
    """Seconds each arm may train: the time to the deadline less the scoring reserve, in two, at most
    SIZES.max_arm_seconds."""
    return max(1.0, min(sizes.max_arm_seconds, (deadline - time.monotonic() - sizes.score_reserve_s) / 2))


def train_both(work: Path, sizes: Sizes, corpus: Path, record: Record, deadline: float) -> bool:
    """The CPLM within its share, then the baseline for as many iterations; False if either failed."""
    share = arm_share(sizes, deadline)
    box: dict[str, int] = {}
    ok = run_phase(record, "train_cplm", lambda: box.update(n=train_arm("cplm", work, sizes, corpus, record, share)))
    ok = ok and run_phase(record, "train_baseline", lambda: train_arm(
        "baseline", work, sizes, corpus, record, 1.5 * share, exit_after=box["n"] if box["n"] < sizes.max_iters else None))
    arms = record.data["arms"]
    if ok:
        record.data["equal_tokens"] = arms["cplm"]["train"]["tokens"] == arms["baseline"]["train"]["tokens"]
    record.write()
    return ok
