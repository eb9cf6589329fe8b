"""What every benchmark measures the same way: device synchronization, relative error against a reference and the
peak memory of a call beyond what existed before it (CUDA's allocator on GPU, torch's MemTracker on CPU). Imported
by the benchmarks as `from benchmarks.common import ...` (their ratios: `benchmarks.ratios`, which imports no torch)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Optional

import torch

HAS_CUDA = torch.cuda.is_available()


def sync() -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if HAS_CUDA:
        torch.cuda.synchronize()


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a - e| / max |e| over the expected tensor's finite entries (float64); inf if the non-finite pattern
    differs or a NaN appears."""
    finite = torch.isfinite(expected)
    if not torch.equal(torch.isfinite(actual), finite) or torch.isnan(actual).any():
        return float("inf")
    if not finite.any():
        return 0.0
    a, e = actual[finite].double(), expected[finite].double()
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()


class MemoryProbe:
    """Bytes allocated since the probe started: now (`current()`) and, once its block has ended, at the peak."""

    def __init__(self, external: Iterable[Any]):
        self.peak: Optional[int] = None
        if HAS_CUDA:
            sync()
            torch.cuda.reset_peak_memory_stats()
            self._before = torch.cuda.memory_allocated()
            return
        from torch.distributed._tools.mem_tracker import MemTracker

        self._cpu = torch.device("cpu")
        self._tracker = MemTracker()
        self._tracker.track_external(*external)  # inputs and modules allocated before: not counted
        self._before = self._total("current")

    def _total(self, kind: str) -> int:
        return self._tracker.get_tracker_snapshot(kind).get(self._cpu, {}).get("Total", 0)

    def current(self) -> int:
        """Bytes allocated now beyond the start (device-synchronized)."""
        if HAS_CUDA:
            sync()
            return torch.cuda.memory_allocated() - self._before
        return self._total("current") - self._before


@contextmanager
def memory_probe(external: Iterable[Any] = ()) -> Iterator[MemoryProbe]:
    """Measure the block's peak allocation beyond what was allocated before it (`probe.peak`, bytes). On CPU the
    tensors and modules in `external` (allocated before the block) are registered so that they are not counted."""
    probe = MemoryProbe(external)
    if HAS_CUDA:
        yield probe
        sync()
        probe.peak = torch.cuda.max_memory_allocated() - probe._before
        return
    with probe._tracker:
        yield probe
    probe.peak = probe._total("peak") - probe._before

