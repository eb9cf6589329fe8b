"""Run a function in N real processes with gloo on 127.0.0.1 (torch.multiprocessing, spawn)."""
from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from typing import Any, Callable, List

import torch.multiprocessing as mp

from cplm_megatron.parallel.distributed import free_port


def _entry(rank: int, fn: Callable, world_size: int, port: int, out_dir: str, args: tuple, env: dict) -> None:
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    import torch

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(rank, *args))
    except BaseException as e:  # report to the parent instead of hanging the others
        result = ("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    if result[0] == "error":
        os._exit(1)
    from cplm_megatron.parallel.distributed import destroy_distributed

    destroy_distributed()


def run_distributed(fn: Callable, world_size: int, *args: Any, env: dict | None = None) -> List[Any]:
    """fn(rank, *args) on `world_size` processes; returns the per-rank results or raises the first error."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _entry, args=(fn, world_size, free_port(), out_dir, args, env or {}),
            nprocs=world_size, join=False, start_method="spawn",
        )
        try:
            while not ctx.join(timeout=600):
                pass
        except Exception:
            errors = []
            for r in range(world_size):
                path = os.path.join(out_dir, f"rank{r}.pkl")
                if os.path.exists(path):
                    status, value = pickle.load(open(path, "rb"))
                    if status == "error":
                        errors.append(value)
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise RuntimeError("\n".join(errors) or "a worker process failed") from None
        results = []
        for r in range(world_size):
            status, value = pickle.load(open(os.path.join(out_dir, f"rank{r}.pkl"), "rb"))
            results.append(value)
        return results
