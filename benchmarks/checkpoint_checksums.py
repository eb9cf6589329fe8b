"""What checkpoint checksums cost: a model with its Adam state (one training step taken) is saved with the trainer's
Checkpointer (torch_dist, synchronous) and loaded back, and the checksum work inside each is timed on its own:
computing the xxh3-128 of every file when the save commits, and checking them before the load.

  taskset -c 1 .venv/bin/python -m benchmarks.checkpoint_checksums --preset tiny
  taskset -c 1 .venv/bin/python -m benchmarks.checkpoint_checksums --preset smollm2-135m --repeats 2

One process, fp32, on CPU unless CUDA is present; the checkpoint goes to --dir (default: a temporary directory on
the filesystem of TMPDIR). Prints one JSON object: bytes, and per repeat the save and load seconds with the
checksum seconds inside them (the page cache holds the files just written or read, as in a run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="model preset (configs/models/*.yaml)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=128, help="of the one training step that fills the Adam state")
    p.add_argument("--dir", type=Path, help="where to save (default: a temporary directory)")
    return p.parse_args(argv)


def build(preset: str, seq_len: int):
    """Model (with the copy head), optimizer and scheduler after one training step, in a one-process group."""
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.copy_head import CopyHeadConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig, free_port
    from cplm_megatron.training.optimizer import (
        OptimizerConfig,
        ScheduleConfig,
        build_optimizer,
        build_scheduler,
        wrap_ddp,
    )
    from cplm_megatron.training.step import setup_model_config, train_step

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    model_cfg = load_preset(preset)
    init_distributed(ParallelConfig(), model_cfg, seed=1234)
    chunks = build_run(model_run(model_cfg, CopyHeadConfig(enabled=True), ParallelConfig(), seq_len=seq_len)).chunks
    opt_cfg = OptimizerConfig()
    chunks = wrap_ddp(chunks, opt_cfg, bf16=False)
    optimizer = build_optimizer(chunks, opt_cfg, "fp32", lr=1e-4, min_lr=1e-5)
    scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(style="constant"), 10, lr=1e-4, min_lr=1e-5)
    setup_model_config(chunks, optimizer)
    import torch

    tokens = torch.randint(0, model_cfg.vocab_size, (1, seq_len + 1))
    batch = dict(tokens=tokens[:, :-1], labels=tokens[:, 1:], loss_mask=torch.ones(1, seq_len),
                 position_ids=torch.arange(seq_len)[None], document_ids=torch.zeros(1, seq_len, dtype=torch.long))
    train_step(chunks, optimizer, scheduler, [batch], seq_len, 1)
    return chunks, optimizer, scheduler


def measure(root: Path, chunks, optimizer, scheduler, repeats: int) -> dict:
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.checkpoint.lookup import checkpoint_files, checksum_files, content_damage, read_record

    saver = Checkpointer(root, keep=1, log=lambda message: None)
    rows = []
    for i in range(repeats):
        start = time.perf_counter()
        path = saver.save(chunks, optimizer, scheduler, TrainState(iteration=i + 1), None, {})
        save_s = time.perf_counter() - start
        start = time.perf_counter()
        checksum_files(path, checkpoint_files(path))  # what the save did inside its commit, timed alone
        checksum_s = time.perf_counter() - start
        start = time.perf_counter()
        saver.load(path, chunks, optimizer, scheduler)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        assert content_damage(path, read_record(path)) == []  # what the load did first, timed alone
        verify_s = time.perf_counter() - start
        rows.append({"save_s": round(save_s, 3), "checksum_s": round(checksum_s, 3), "load_s": round(load_s, 3),
                     "verify_s": round(verify_s, 3)})
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"bytes": size, "files": len(checkpoint_files(path)), "repeats": rows, "median": median,
            "checksum_share_of_save": round(median["checksum_s"] / median["save_s"], 4),
            "verify_share_of_load": round(median["verify_s"] / median["load_s"], 4)}


def main(argv=None) -> int:
    args = parse_args(argv)
    from cplm_megatron.parallel.megatron_patches import setup_compat

    setup_compat()
    import torch

    chunks, optimizer, scheduler = build(args.preset, args.seq_len)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        result = measure(Path(tmp) / "checkpoints", chunks, optimizer, scheduler, args.repeats)
    params = sum(p.numel() for c in chunks for p in c.parameters())
    print(json.dumps({"preset": args.preset, "parameters": params, "torch_threads": torch.get_num_threads(),
                      "device": "cuda" if torch.cuda.is_available() else "cpu", **result}, indent=2))
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
