"""`train.profile_steps=[first, last]`: torch.profiler over those training iterations on rank 0, summarized in
RUN_DIR/profile.json: wall time per step, kernel launches and host synchronizations per step (CUDA runtime calls),
device kernels per step and their time, the top kernels and CPU ops, and how often compiled regions ran.

Each profiled step ends with a device synchronization so its wall time holds all of its kernels. The profiler
slows the steps it records (more on CPU-bound steps): read speed from unprofiled steps, kernel counts from these.
On a CPU-only machine there are no kernels: `cpu_ops_per_step` (aten operators dispatched, nested ones included)
is the comparable count.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

TOP = 20
# CUDA runtime/driver calls that launch kernels, and those that block the host until the device catches up
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel", "cudaGraphLaunch")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
MATMUL_NAMES = ("gemm", "nvjet", "cutlass", "xmma", "cublas")


class StepProfiler:
    """Profiles iterations [first, last] of this launch (rank 0 only; a no-op without `steps`)."""

    def __init__(self, steps: Optional[Sequence[int]], path: Path, active: bool = True):
        self.first, self.last = (steps[0], steps[1]) if steps and active else (0, -1)
        self.path = Path(path)
        self.prof: Any = None
        self.step_s: List[float] = []
        self._t0 = 0.0

    def begin(self, iteration: int) -> None:
        """Before training iteration `iteration` (1-based)."""
        if iteration == self.first:
            import torch

            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities)
            _synchronize()
            self.prof.start()
        if self.prof is not None:
            self._t0 = time.perf_counter()

    def end(self, iteration: int) -> None:
        """After iteration `iteration`: its wall time; after the last one, the summary."""
        if self.prof is None:
            return
        _synchronize()
        self.step_s.append(time.perf_counter() - self._t0)
        self.prof.step()
        if iteration >= self.last:
            self.close()

    def close(self) -> None:
        """Stop and write the summary (a run that ends before `last` writes the steps it profiled)."""
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        if self.step_s:
            summary = summarize(prof.key_averages(), len(self.step_s))
            summary.update(iterations=[self.first, self.first + len(self.step_s) - 1], step_s=self.step_s,
                           mean_step_s=sum(self.step_s) / len(self.step_s), device=_device_name())
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(summary, indent=1) + "\n")
            print(f"[profile] iterations {summary['iterations']}: {summary['kernel_launches_per_step']:.0f} kernel "
                  f"launches, {summary['cpu_ops_per_step']:.0f} aten ops per step -> {self.path}", flush=True)


def summarize(events: Sequence[Any], steps: int) -> Dict[str, Any]:
    """Per-step counts and the top kernels / CPU ops of torch.profiler's `key_averages()` over `steps` steps."""
    from torch.autograd import DeviceType

    def count(names: Sequence[str]) -> float:
        return sum(e.count for e in events if e.key in names) / steps

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    kernel_us = sum(_self_device_us(e) for e in kernels)
    matmul_us = sum(_self_device_us(e) for e in kernels if any(m in e.key.lower() for m in MATMUL_NAMES))
    cpu_ops = [e for e in events if e.device_type == DeviceType.CPU]
    return {
        "steps": steps,
        "kernel_launches_per_step": count(LAUNCH_CALLS),
        "host_syncs_per_step": count(SYNC_CALLS),
        "device_kernels_per_step": sum(e.count for e in kernels) / steps,
        "device_kernel_us_per_step": kernel_us / steps,
        "matmul_share_of_kernel_time": matmul_us / kernel_us if kernel_us else None,
        "cpu_ops_per_step": sum(e.count for e in cpu_ops if e.key.startswith("aten::")) / steps,
        "compiled_regions_per_step": sum(e.count for e in cpu_ops if e.key.startswith("Torch-Compiled Region"))
        / steps,
        "top_kernels": [{"name": e.key, "us_per_step": _self_device_us(e) / steps, "per_step": e.count / steps}
                        for e in sorted(kernels, key=_self_device_us, reverse=True)[:TOP]],
        "top_cpu_ops": [{"name": e.key, "self_cpu_us_per_step": e.self_cpu_time_total / steps,
                         "per_step": e.count / steps}
                        for e in sorted(cpu_ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP]
                        if not e.key.startswith("ProfilerStep")],
    }


def _self_device_us(event: Any) -> float:
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0))


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
