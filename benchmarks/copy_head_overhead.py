"""Copy-Paste head overhead: forward+backward step time and peak memory, baseline vs CPLM.

Both models are built from the same seed in the same process and timed interleaved (A, B, A, B, ...)
on the same batch, so the ratio is measured side by side. Peak memory of one step beyond the weights and
batch: CUDA max allocated on GPU, torch's MemTracker (every tensor storage followed) on CPU.

  python -m benchmarks.copy_head_overhead [--json OUT.json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.ratios import ratio

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    "tiny": {"preset": "tiny"},
    "135m-shaped-2l": {"preset": "smollm2-135m", "num_layers": 2},
    "smollm2-135m": {"preset": "smollm2-135m"},
    "smollm2-1.7b": {"preset": "smollm2-1.7b"},
}
CPU_MODELS = ["tiny", "135m-shaped-2l"]


def _build(model_name: str, copy: bool, seq: int, dtype: str = "fp32"):
    import torch

    from cplm_megatron.model.builder import PrecisionConfig, build_run, model_run
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.copy_head import CopyHeadConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig, set_seed
    from cplm_megatron.parallel.megatron_patches import setup_compat

    spec = dict(MODELS[model_name])
    cfg = load_preset(spec.pop("preset"), max_position_embeddings=max(seq, 2048), **spec)
    setup_compat()
    init_distributed(ParallelConfig(), cfg, seed=1)
    set_seed(1)
    model = build_run(model_run(cfg, CopyHeadConfig(enabled=copy), precision=PrecisionConfig(dtype=dtype),
                                seq_len=seq)).model
    g = torch.Generator().manual_seed(0)
    device = next(model.parameters()).device
    tokens = torch.randint(0, cfg.vocab_size, (1, seq + 1), generator=g)
    tokens[:, seq // 2:] = tokens[:, : seq + 1 - seq // 2].clone()  # a repeated half: the head has work to do
    batch = dict(input_ids=tokens[:, :-1].to(device), labels=tokens[:, 1:].to(device),
                 position_ids=torch.arange(seq, device=device)[None])
    return model, batch


def _step(model, batch) -> None:
    model.zero_grad(set_to_none=True)
    loss = model(batch["input_ids"], batch["position_ids"], None, labels=batch["labels"])
    loss.sum().backward()


def time_pair(model_name: str, seq: int, reps: int, dtype: str) -> Dict[str, float]:
    """Median step seconds of baseline and CPLM, interleaved."""
    from benchmarks.common import sync

    base, batch = _build(model_name, False, seq, dtype)
    cplm, _ = _build(model_name, True, seq, dtype)
    for _ in range(2):
        _step(base, batch)
        _step(cplm, batch)
    times: Dict[str, List[float]] = {"baseline": [], "cplm": []}
    for _ in range(reps):
        for name, model in (("baseline", base), ("cplm", cplm)):
            sync()
            t0 = time.perf_counter()
            _step(model, batch)
            sync()
            times[name].append(time.perf_counter() - t0)
    out = {f"{k}_step_s": statistics.median(v) for k, v in times.items()}
    for name, model in (("baseline", base), ("cplm", cplm)):
        out[f"{name}_peak_mem_mib"] = step_peak_mib(model, batch)
    return out


def step_peak_mib(model, batch) -> float:
    """Peak memory of one step above what is allocated before it (weights, batch), in MiB: CUDA's allocator
    statistics on GPU; on CPU torch's MemTracker, which follows every tensor storage (RSS would hide reuse)."""
    from benchmarks.common import HAS_CUDA, memory_probe

    if not HAS_CUDA:
        model.zero_grad(set_to_none=True)  # the tracker counts storages it saw allocated: free the old grads first
    with memory_probe([model, *batch.values()]) as probe:
        _step(model, batch)
    return probe.peak / 2**20


def _subprocess(args: List[str]) -> Dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.copy_head_overhead", *args], capture_output=True, text=True,
                          env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(model_name: str, seq: int, reps: int, dtype: str) -> Dict:
    row = {"model": model_name, "seq_len": seq, "micro_batch": 1, "dtype": dtype}
    row.update(_subprocess(["--worker-time", model_name, str(seq), str(reps), dtype]))
    import torch

    row["memory_measure"] = ("CUDA max allocated" if torch.cuda.is_available() else "torch MemTracker peak (CPU)") + \
        " during one step above the step's start (weights and batch excluded)"
    row["time_ratio"] = ratio(row["cplm_step_s"], row["baseline_step_s"])
    row["memory_ratio"] = ratio(row["cplm_peak_mem_mib"], max(row["baseline_peak_mem_mib"], 1e-9))
    return row


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write all rows to this file")
    p.add_argument("--quick", action="store_true", help="tiny model at seq 512 only, 2 repetitions")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="parameter/compute dtype")
    p.add_argument("--seqs", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=CPU_MODELS)
    p.add_argument("--worker-time", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_time:
        name, seq, reps, dtype = args.worker_time
        print(json.dumps(time_pair(name, int(seq), int(reps), dtype)))
        return 0
    grid = [("tiny", 512)] if args.quick else [(m, s) for m in args.models for s in args.seqs]
    reps = 2 if args.quick else args.reps
    rows = []
    print(f"{'model':<24}{'seq':>6}{'base s':>10}{'cplm s':>10}{'time x':>8}{'base MiB':>10}{'cplm MiB':>10}{'mem x':>7}")
    for model_name, seq in grid:
        row = measure(model_name, seq, reps, args.dtype)
        rows.append(row)
        print(f"{model_name:<24}{seq:>6}{row['baseline_step_s']:>10.3f}{row['cplm_step_s']:>10.3f}"
              f"{row['time_ratio']:>8.3f}{row['baseline_peak_mem_mib']:>10.1f}{row['cplm_peak_mem_mib']:>10.1f}"
              f"{row['memory_ratio']:>7.3f}", flush=True)
    import torch

    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "threads": torch.get_num_threads(), "rows": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
