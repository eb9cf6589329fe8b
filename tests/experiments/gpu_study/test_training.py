"""The GPU study's training bookkeeping: both arms train on the same settings but the copy head (the baseline stops
at the CPLM's count), an arm's time share waits for the trainer's handler, and an arm's figures come from its run
files through the toolkit's readers."""
from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

from cplm_megatron.experiments.gpu_study.sizes import GPU
from cplm_megatron.experiments.gpu_study.time_share import TimeShare
from cplm_megatron.experiments.gpu_study.training import (final_train_loss, launch_record, probes, stopped_by,
                                                            train_overrides)
from cplm_megatron.run_config import LoggingConfig
from cplm_megatron.training.metrics_log import MetricsLogger, read_metrics
from cplm_megatron.training.run_record import Layout, RunRecord, write_run_record


def test_the_arms_differ_only_in_the_copy_head_and_the_baseline_stops_at_the_cplms_count():
    base, cplm = (train_overrides(arm, GPU, Path("/c"), Path("/r"), 8192, exit_after=700 if arm == "baseline" else None)
                  for arm in ("baseline", "cplm"))
    assert [a for a, b in zip(base, cplm) if a != b] == ["copy_head.enabled=false"]
    assert base[len(cplm):] == ["train.exit_after_iters=700"] and len(base) == len(cplm) + 1
    assert "data.streams=[/c/train]" in base and "model.vocab_size=8192" in base and "schedule.style=constant" in base
    assert "train.probe_interval=100" in base and "model.hidden_size=256" in base and "model.num_layers=4" in base


def test_an_arm_is_stopped_by_its_time_share_only_when_its_run_stopped_early():
    """A share that fires while a run that reached its cap exits ended nothing (found when the dry run's CPLM reached
    its 400-step cap within its 25 s on a fast CI machine and was reported as stopped by its share)."""
    stopped, finished = (RunRecord(preset="tiny", copy_head=True, layout=Layout(1, 1, 1, None, False, 1), nodes=1,
                                   device="cpu", seq_len=128, global_batch=4, iterations=400, tokens_per_sec=900.0,
                                   tflops_per_device=None, mfu=None, step_time=None, peak_memory_gib=0.5,
                                   config_hash="", flops_per_token=1.0, stopped_early=early) for early in (True, False))
    assert stopped_by(True, stopped, None) == "time share" and stopped_by(True, None, None) == "time share"
    assert stopped_by(True, finished, None) == "iteration cap" and stopped_by(False, finished, None) == "iteration cap"
    assert stopped_by(True, finished, 700) == "the CPLM's iteration count" == stopped_by(False, finished, 700)


def test_a_time_share_waits_for_the_trainers_handler():
    """The share's stop signal goes out only once a handler is installed: a start-up longer than the share still
    gets its stop (not the iteration cap), and cancelled before the share ends it sends nothing."""
    got = []
    with TimeShare(0.05, poll_s=0.01) as share:
        time.sleep(0.3)  # "start-up": the signal is ignored meanwhile, and not sent
        assert not share.fired and not got
        signal.signal(signal.SIGUSR1, lambda *_: got.append(time.monotonic()))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    assert share.fired and len(got) == 1
    with TimeShare(30) as early:
        pass
    assert not early.fired and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_an_arms_figures_come_from_its_run_files(tmp_path: Path):
    """The last training loss is the output distribution's NLL (`loss` of a record with an objective, `mix_loss` of an
    older one; never a validation record's), probes carry the tokens trained by their step, and the launch record is
    the finished run's, else the one of a launch stopped early (its time share), else none."""
    run = tmp_path / "study_cplm"
    assert launch_record(run) is None and final_train_loss(read_metrics(run)) is None
    logger = MetricsLogger(run, LoggingConfig(wandb=False), {}, active=True)
    logger.log({"iteration": 0, "probe_copy_accuracy": 0.01, "probe_in_context_score": 0.2, "probe_copy_chance": 0.002})
    logger.log({"iteration": 10, "loss": 4.0, "mix_loss": 3.5})  # a record written before `objective` existed
    assert final_train_loss(read_metrics(run)) == 3.5
    logger.log({"iteration": 20, "loss": 3.0, "objective": 3.4, "lm_loss": 3.2})
    logger.log({"iteration": 20, "val_loss": 2.9, "loss": 2.9})
    logger.log({"iteration": 20, "probe_copy_accuracy": 0.5, "probe_in_context_score": -0.3})
    metrics = read_metrics(run)
    assert final_train_loss(metrics) == 3.0
    assert probes(metrics, 4096) == [
        {"iteration": 0, "tokens": 0, "probe_copy_accuracy": 0.01, "probe_in_context_score": 0.2,
         "probe_copy_chance": 0.002},
        {"iteration": 20, "tokens": 20 * 4096, "probe_copy_accuracy": 0.5, "probe_in_context_score": -0.3,
         "probe_copy_chance": None}]
    record = RunRecord(preset="tiny", copy_head=True, layout=Layout(1, 1, 1, None, False, 1), nodes=1, device="cpu",
                       seq_len=128, global_batch=4, iterations=20, tokens_per_sec=900.0, tflops_per_device=None,
                       mfu=None, step_time=None, peak_memory_gib=0.5, config_hash="", flops_per_token=1.0,
                       stopped_early=True)
    write_run_record(run, record)
    assert launch_record(run) == record
    write_run_record(run, replace(record, iterations=30, stopped_early=False))
    assert launch_record(run).iterations == 30
