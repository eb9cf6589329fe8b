"""Logged throughput is the logging interval's own (training/throughput.py): a slow first step (compilation,
allocator warm-up) is marked warm-up and drags neither the later log lines, nor the run record, nor the ETA (wall
time per step after the first step: evaluation and saves included)."""
from __future__ import annotations

import json

import pytest

from cplm_megatron.training.throughput import SpeedMonitor
from tests.training import pretrain_utils as pu


class Clock:
    """A clock the test advances by hand: the monitor's arithmetic on known step durations."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _monitor(clock: Clock, total: int = 10) -> SpeedMonitor:
    return SpeedMonitor(flops_per_token=1e6, tokens_per_step=1000, world_size=2, peak_tflops=1.0, total_iters=total,
                        clock=clock)


def _steps(monitor: SpeedMonitor, clock: Clock, durations, gap: float = 0.0) -> None:
    for seconds in durations:
        monitor.begin_step()
        clock.now += seconds
        monitor.end_step()
        clock.now += gap  # evaluation, checkpoint saves, logging: not a step's time


def test_each_interval_reports_its_own_rate_and_the_first_is_warmup():
    clock = Clock()
    monitor = _monitor(clock)
    _steps(monitor, clock, [10.0, 0.5], gap=3.0)
    first = monitor.interval(2)
    assert first["warmup"] and first["step_time"] == pytest.approx(5.25) and first["interval_steps"] == 2
    _steps(monitor, clock, [0.5, 0.5, 0.5], gap=3.0)
    second = monitor.interval(5)
    assert not second["warmup"] and second["step_time"] == pytest.approx(0.5)
    assert second["tokens_per_sec"] == pytest.approx(2000.0)
    assert second["tflops_per_device"] == pytest.approx(1e6 * 2000 / 2 / 1e12)
    assert second["mfu"] == pytest.approx(second["tflops_per_device"])
    assert monitor.interval(5) == {}  # no step since


def test_the_eta_is_wall_time_per_step_after_the_first_step():
    """A 10 s first step (compilation) then 0.5 s steps, each followed by 0.5 s of logging, evaluation or saving:
    1 s of wall time per remaining step. The step-time rate of the warm-up interval said (10 - 3) x 11/3 = 25.7 s
    for the 7 s left; the steps' time alone says 3.5 s."""
    clock = Clock()
    monitor = _monitor(clock)
    _steps(monitor, clock, [10.0], gap=0.5)
    assert "eta_sec" not in monitor.interval(1)  # one step: no rate yet (the console line shows no ETA)
    _steps(monitor, clock, [0.5, 0.5], gap=0.5)
    assert monitor.interval(3)["eta_sec"] == pytest.approx(7 * 1.0)
    _steps(monitor, clock, [0.5] * 4, gap=2.5)  # 2 s of evaluation after each step from here
    assert monitor.interval(7)["eta_sec"] == pytest.approx(3 * (22.0 - 10.0) / 6)  # steps 1 and 7 ended at 10, 22 s


def test_the_record_leaves_the_warmup_interval_out():
    clock = Clock()
    monitor = _monitor(clock)
    _steps(monitor, clock, [10.0])
    monitor.interval(1)
    _steps(monitor, clock, [0.5, 0.5])
    monitor.interval(3)
    _steps(monitor, clock, [1.0])  # the open interval counts too
    steady = monitor.steady()
    assert steady["step_time"] == pytest.approx(2.0 / 3) and steady["measured_steps"] == 3
    assert not steady["includes_warmup"]


@pytest.mark.parametrize("logged", [True, False], ids=["logged-once", "never-logged"])
def test_a_launch_without_a_second_interval_reports_every_step_marked(logged):
    clock = Clock()
    monitor = _monitor(clock)
    _steps(monitor, clock, [3.0, 1.0])
    if logged:
        monitor.interval(2)
    steady = monitor.steady()
    assert steady["step_time"] == pytest.approx(2.0) and steady["measured_steps"] == 2 and steady["includes_warmup"]


@pytest.fixture(scope="module")
def slow_first_run(tmp_path_factory):
    """A tiny run on synthetic data whose first step is 3 s slower (fault slow_first_step), with
    model.lm_head_loss=auto: (run dir, stdout)."""
    run_dir = tmp_path_factory.mktemp("throughput") / "run"
    overrides = [f"run.dir={run_dir}", "data.synthetic=copy", "train.iters=6", "train.log_interval=1",
                 "train.eval_interval=0", "checkpoint.enabled=false", "logging.wandb=false", "train.seq_len=64",
                 "train.micro_batch=2", "train.global_batch=2", "model.lm_head_loss=auto"]
    proc = pu.run(1, overrides, fault=("slow_first_step", 3))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc.stdout


@pytest.mark.mcore
@pytest.mark.slow  # a warm trainer process
def test_a_slow_first_step_does_not_drag_later_logged_rates(slow_first_run):
    """Each later line's step time is at most the wall time between its log line and the previous one (the
    interval's own steps), and the record leaves step 1 out. A running average since step 1 fails this (its
    step 2 would report >= 1.5 s)."""
    run_dir, stdout = slow_first_run
    records = [r for r in pu.metrics(run_dir) if "step_time" in r]
    assert [r["iteration"] for r in records] == list(range(1, 7))
    assert records[0]["warmup"] and records[0]["step_time"] >= 3.0 and "(warm-up)" in stdout
    for previous, record in zip(records, records[1:]):
        assert not record["warmup"]
        # the 0.05 s: the interval's wall time also holds the previous line's logging, never less than its steps
        assert record["step_time"] <= record["time"] - previous["time"] + 0.05, (previous, record)
    summary = json.loads((run_dir / "run_record.json").read_text())
    assert summary["measured_steps"] == 5 and not summary["includes_warmup"]
    assert summary["step_time"] == pytest.approx(sum(r["step_time"] for r in records[1:]) / 5, rel=1e-6)


@pytest.mark.mcore
@pytest.mark.slow
def test_auto_lm_head_loss_is_resolved_reported_and_recorded(slow_first_run):
    """model.lm_head_loss=auto on a tiny model: Megatron's path (its logits are a sliver of the host's memory),
    said at start with the figures, and named in the run record; config.yaml keeps the setting, `auto`, with what
    it resolved to beside it (it held the resolved path: a relaunch from it on another GPU kept the old choice)."""
    import yaml

    from cplm_megatron.run_config import load_run_config

    run_dir, stdout = slow_first_run
    line = next(line for line in stdout.splitlines() if "model.lm_head_loss=auto ->" in line)
    assert line.startswith("[train] model.lm_head_loss=auto -> megatron: Megatron's logits take ") and "GiB" in line
    text = (run_dir / "config.yaml").read_text()
    assert "\n  lm_head_loss: auto  # resolved to megatron in this launch\n" in text, text
    assert yaml.safe_load(text)["model"]["lm_head_loss"] == "auto"
    assert load_run_config(str(run_dir / "config.yaml")).model.lm_head_loss == "auto"  # a relaunch resolves anew
    record = json.loads((run_dir / "run_record.json").read_text())
    assert record["lm_head_loss"] == "megatron"
    # the record's FLOPs and memory figures (model/accounting's, for this config: nothing recomputed here)
    assert record["model_flops_per_token"] == record["flops_per_token"] > record["causal_flops_per_token"] > 0
    assert 0 < record["memory_estimate_gib"] < 4
