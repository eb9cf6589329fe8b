"""Throughput accounting: tokens/s, TFLOP/s per device, MFU against a configurable peak, ETA."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

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
class SpeedMonitor:
    """Windowed step timing -> throughput metrics."""

    flops_per_token: float
    tokens_per_step: int
    world_size: int
    peak_tflops: float
    total_iters: int
    window: int = 20
    _times: List[float] = field(default_factory=list)
    _last: Optional[float] = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def step(self) -> float:
        """Record the end of a step; returns its duration in seconds."""
        now = time.perf_counter()
        dt = now - (self._last if self._last is not None else now)
        self._last = now
        self._times = (self._times + [dt])[-self.window:]
        return dt

    def metrics(self, iteration: int) -> Dict[str, float]:
        if not self._times:
            return {}
        step_time = sum(self._times) / len(self._times)
        tokens_per_sec = self.tokens_per_step / step_time
        tflops = self.flops_per_token * tokens_per_sec / self.world_size / 1e12
        return {
            "step_time": step_time,
            "tokens_per_sec": tokens_per_sec,
            "tflops_per_device": tflops,
            "mfu": tflops / self.peak_tflops,
            "eta_sec": max(0, self.total_iters - iteration) * step_time,
        }
