"""Throughput accounting: tokens/s, TFLOP/s per device, MFU against a configurable peak, ETA.

Rates are the logging interval's own (the training steps since the previous log line, Megatron-LM's and
torchtitan's convention), not a running average: the first interval of a launch holds compilation and
allocator warm-up and is marked `warmup`; the run record's figures leave it out. Only the steps are timed
(fetching their micro-batches, forward, backward, optimizer): evaluation and checkpoint saves are not.
The ETA is wall time: the remaining steps at the launch's wall seconds per step since its first step ended
(evaluation and saves included, the first step's compilation not); none before a second step ends.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

# Dense bf16 peak TFLOP/s per device by name fragment (vendor spec sheets, no sparsity).
PEAK_TFLOPS_BY_GPU = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}
NOMINAL_CPU_PEAK_TFLOPS = 1.0


def default_peak_tflops() -> float:
    """Peak of the local device: the GPU spec table, or a nominal 1 TFLOP/s on CPU."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        for key, value in PEAK_TFLOPS_BY_GPU.items():
            if key in name:
                return value
    return NOMINAL_CPU_PEAK_TFLOPS


@dataclass
class _Span:
    """Steps and the seconds they took."""

    steps: int = 0
    seconds: float = 0.0

    def add(self, steps: int, seconds: float) -> None:
        self.steps += steps
        self.seconds += seconds


@dataclass
class SpeedMonitor:
    """Per-interval step timing -> throughput metrics (`interval`) and the launch's steady state (`steady`)."""

    flops_per_token: float
    tokens_per_step: int
    world_size: int
    peak_tflops: float
    total_iters: int
    clock: Callable[[], float] = time.perf_counter
    _started: Optional[float] = None
    _open: _Span = field(default_factory=_Span)  # the steps since the last log line
    _warmup: _Span = field(default_factory=_Span)  # the first closed interval
    _steady: _Span = field(default_factory=_Span)  # every closed interval after it
    _closed: int = 0
    _first_end: Optional[float] = None  # the clock when the launch's first step ended
    _last_end: Optional[float] = None
    _steps_after_first: int = 0

    def begin_step(self) -> None:
        """A training step starts (before its micro-batches are fetched)."""
        self._started = self.clock()

    def end_step(self) -> float:
        """The step ended; returns its duration in seconds."""
        now = self.clock()
        seconds = now - self._started
        self._open.add(1, seconds)
        if self._first_end is None:
            self._first_end = now
        else:
            self._steps_after_first += 1
        self._last_end = now
        return seconds

    def rates(self, step_time: float) -> Dict[str, float]:
        """tokens/s, TFLOP/s per device and MFU at `step_time` seconds per step."""
        tokens_per_sec = self.tokens_per_step / step_time
        tflops = self.flops_per_token * tokens_per_sec / self.world_size / 1e12
        return {"step_time": step_time, "tokens_per_sec": tokens_per_sec, "tflops_per_device": tflops,
                "mfu": tflops / self.peak_tflops}

    def interval(self, iteration: int) -> Dict[str, float]:
        """The rates of the steps since the previous call (which closes the interval), `warmup` (True for a
        launch's first interval), and `eta_sec` (see the module's docstring; absent before a second step ended);
        {} if no step ended since."""
        span, warmup = self._open, self._closed == 0
        if not span.steps:
            return {}
        step_time = span.seconds / span.steps
        (self._warmup if warmup else self._steady).add(span.steps, span.seconds)
        self._open, self._closed = _Span(), self._closed + 1
        out = {**self.rates(step_time), "interval_steps": span.steps, "warmup": warmup}
        if self._steps_after_first:
            wall_per_step = (self._last_end - self._first_end) / self._steps_after_first
            out["eta_sec"] = max(0, self.total_iters - iteration) * wall_per_step
        return out

    def steady(self) -> Dict[str, float]:
        """The launch's figures for its record: every step after the first logged interval (the open one
        included); a launch that logged at most once reports all its steps, marked as including warm-up."""
        span, warmup_included = _Span(self._steady.steps, self._steady.seconds), False
        if self._closed > 0:
            span.add(self._open.steps, self._open.seconds)
        if not span.steps:  # nothing measured after the warm-up interval: report the launch's every step
            span, warmup_included = _Span(self._warmup.steps, self._warmup.seconds), True
            span.add(self._open.steps, self._open.seconds)
        if not span.steps:
            return {}
        return {**self.rates(span.seconds / span.steps), "measured_steps": span.steps,
                "includes_warmup": warmup_included}
