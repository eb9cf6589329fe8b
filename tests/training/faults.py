"""Fault injection for the trainer's crash tests, kept out of the package: this script stands in for
pretrain/pretrain_cplm.py (`python tests/training/faults.py FAULT ITERATION PRETRAIN_ARGS...`, or in warm
processes), wraps the Checkpointer's save steps of this process (`_write_shards`, `_schedule`: its seams),
then runs the trainer's own `script_main`.

FAULT is one of
* `crash_during_save`: exit 17 right after this iteration's shards are written, before the commit;
* `kill_async_writer`: rank 0's background writer of this iteration's save is SIGKILLed while its
  file-writing workers (forked by it) are alive; they stop themselves at birth, so the kill always lands
  mid-save and leaves them orphaned, as an out-of-memory kill of the writer would;
* `slow_first_step`: the launch's first training step takes ITERATION seconds longer (a stand-in for
  compilation and allocator warm-up), for the interval throughput test.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import List

FAULTS = ("crash_during_save", "kill_async_writer", "slow_first_step")
CRASH_EXIT_CODE = 17
SCRIPT = Path(__file__).resolve()
_STOP_GRANDCHILDREN_OF = {"pid": None}


def fault_args(fault: str, iteration: int) -> List[str]:
    """This script's leading arguments (before the trainer's) for `fault` at save `iteration`."""
    assert fault in FAULTS, fault
    return [fault, str(iteration)]


def _stop_grandchildren_at_birth() -> None:  # an os.register_at_fork hook
    parent = _STOP_GRANDCHILDREN_OF["pid"]
    if parent is not None and os.getppid() != parent:  # a worker forked by the writer, not the writer itself
        os.kill(os.getpid(), signal.SIGSTOP)


def _kill_writers_mid_save(pids: List[int]) -> None:
    """Wait (up to 5 s) until each writer has forked its workers, then SIGKILL it."""
    import psutil

    deadline = time.monotonic() + 5
    for pid in pids:
        while time.monotonic() < deadline and not psutil.Process(pid).children():
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
    _STOP_GRANDCHILDREN_OF["pid"] = None


def _slow_first_step(seconds: int) -> None:
    """The trainer's first train_step of this process sleeps `seconds` first."""
    from cplm_megatron.training import trainer

    train_step, calls = trainer.train_step, []

    def slow_train_step(*args, **kwargs):
        if not calls:
            time.sleep(seconds)
        calls.append(1)
        return train_step(*args, **kwargs)

    trainer.train_step = slow_train_step


def install(fault: str, iteration: int) -> None:
    """Wrap this process's Checkpointer so that its save of `iteration` meets `fault` (or slow its first step)."""
    if fault == "slow_first_step":
        return _slow_first_step(iteration)
    import torch.distributed as dist

    from cplm_megatron.checkpoint.checkpointer import Checkpointer
    from cplm_megatron.checkpoint.lookup import iteration_of

    write_shards, schedule = Checkpointer._write_shards, Checkpointer._schedule

    def hit(self: Checkpointer, target: Path) -> bool:
        if iteration_of(Path(target)) != iteration:
            return False
        return fault == "crash_during_save" or (self.async_save and dist.get_rank() == 0)

    def faulty_write_shards(self: Checkpointer, state, target: Path):
        if fault == "kill_async_writer" and hit(self, target):
            os.register_at_fork(after_in_child=_stop_grandchildren_at_birth)
            _STOP_GRANDCHILDREN_OF["pid"] = os.getpid()
        request = write_shards(self, state, target)
        if fault == "crash_during_save" and hit(self, target):
            os._exit(CRASH_EXIT_CODE)
        return request

    def faulty_schedule(self: Checkpointer, request, target: Path) -> None:
        schedule(self, request, target)
        if fault == "kill_async_writer" and hit(self, target):
            _kill_writers_mid_save(self._writer_pids())

    Checkpointer._write_shards = faulty_write_shards
    Checkpointer._schedule = faulty_schedule


if __name__ == "__main__":
    name, at, *trainer_args = sys.argv[1:]
    if name not in FAULTS:
        sys.exit(f"error: unknown fault {name!r}; one of {', '.join(FAULTS)}")
    install(name, int(at))
    from cplm_megatron.pretrain import script_main

    sys.exit(script_main(trainer_args))
