"""Training checkpoints: torch_dist (megatron.core.dist_checkpointing), atomic `latest`, keep-last-N.

Layout under `<run.dir>/checkpoints/`:

    iter_0000100/      model + optimizer (+ rng, when the layout matches) sharded tensors,
                       common state (iteration, consumed tokens, scheduler, data loader, config)
    iter_0000100/cplm_state.json   the same scalars + saving layout + the size and xxh3-128 checksum of every
                                   other file, readable without torch (a versioned
                                   `lookup.CheckpointRecord`, written last: it commits the save)
    latest             "iter_0000100", written (atomically, by rank 0) only after every rank
                       finished writing; auto-resume reads it
    latest.trainer     the same name, written right after `latest`: tells a rollback (a person moved
                       `latest` back) from a crash between the commit and the move (`resume`)

A crash during a save leaves `latest` on the previous complete checkpoint; the partial directory is
removed by the next successful save. The checksums are computed from the files on disk when a save commits (every
rank reads its share) and checked before a checkpoint is loaded (`load`): a file changed since (a flipped bit, a
bad disk, a partial copy) is a CheckpointError naming the previous intact checkpoint. Pruning (keep the newest
`keep`) only ever deletes checkpoints of this run's own history: the ones this launch wrote and the ones up to the
checkpoint it resumed from (checked when loaded), and never the one just committed, so the newest intact
checkpoint is kept while anything newer is unchecked. Model and
optimizer states reshard to any TP/PP/DP layout (optimizer: Megatron's `fully_reshardable` format); RNG
states are restored only under the saving layout. Finding and checking checkpoints on disk:
`lookup`.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from cplm_megatron.checkpoint.lookup import (
    LATEST,
    STATE_JSON,
    TRAINER_LATEST,
    CheckpointRecord,
    checkpoint_files,
    checksum_files,
    content_damage,
    damaged_contents_message,
    iter_dir_name,
    iteration_of,
    list_checkpoints,
    read_record,
)
from cplm_megatron.checkpoint.orphan_watchdog import ensure_orphan_watchdog, stop_signals_blocked
from cplm_megatron.checkpoint.orphan_watchdog import notice as notice_helpers
from cplm_megatron.checkpoint.weights import load_model_state, model_sharded_state_dict
from cplm_megatron.durable_files import write_atomic
from cplm_megatron.errors import CheckpointError

OPTIM_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
# megatron-core logs a failed file writer ("Local process 0 encountered an error: ...") before it raises that error:
# the raised one is reported (one line for a full disk or the file-size limit, else with its traceback)
_WRITER_LOG = "megatron.core.dist_checkpointing.strategies.filesystem_async"


class _RaisedAnyway(logging.Filter):
    """Drops megatron-core's log line of a writer's failure, which the save raises."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "encountered an error" not in record.getMessage()


def _quiet_writer_failures() -> None:
    writer_log = logging.getLogger(_WRITER_LOG)
    if not any(isinstance(f, _RaisedAnyway) for f in writer_log.filters):
        writer_log.addFilter(_RaisedAnyway())


def _become_subreaper() -> None:
    """Orphaned descendants (the workers of a writer that died) reparent to this process instead of init, so a
    failing trainer can stop them (`signals.kill_descendants`) rather than leave them running."""
    if os.uname().sysname == "Linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def _async_strategy_kwargs() -> Dict[str, str]:
    """megatron-core >= 0.19 defaults async saves to nvidia-resiliency-ext ("nvrx", not installed here); its
    own "mcore" strategy is the one 0.16 always used."""
    import inspect

    from megatron.core import dist_checkpointing

    return {"async_strategy": "mcore"} if "async_strategy" in inspect.signature(dist_checkpointing.save).parameters else {}


_ASYNC_STRATEGY: Dict[str, str] = {}


class CheckpointWriterDied(RuntimeError):
    """A background (async) checkpoint writer process died before its save finished."""


@dataclass
class TrainState:
    """Scalars restored with a checkpoint."""

    iteration: int = 0
    consumed_tokens: int = 0
    skipped_steps: int = 0


def _layout() -> Dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "cp": ps.get_context_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
    }


def _rng_sharded_object(load: bool):
    """Per-(pp, tp) RNG states as a ShardedObject (replicated across DP), as Megatron-LM saves them."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = None
    if not load:
        state = {
            "random": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
        }
    pp, tp = ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
    return ShardedObject(
        "rng_state", state, (pp, tp),
        (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def _restore_rng(state: Dict[str, Any]) -> None:
    from megatron.core import tensor_parallel

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


class Checkpointer:
    """Save/resume of the full training state for one run directory (all methods are collective)."""

    def __init__(self, ckpt_root: Path, keep: int = 2, async_save: bool = False, log: Callable[[str], None] = print,
                 resumed_from: Optional[int] = None, checkpoint_size: float = 0.0):
        """`resumed_from`: the iteration this launch resumed from in `ckpt_root` (None: a fresh start). The
        checkpoints up to it are this run's history; later ones and those of other runs are never pruned.
        `checkpoint_size`: the planner's bytes per checkpoint (to tell a full disk from other save failures)."""
        self.root = Path(ckpt_root)
        self.checkpoint_size = checkpoint_size
        self._broken = False
        self._in_flight: Optional[Path] = None
        self.keep = keep
        self.async_save = async_save
        self.log = log
        self._own = {p.name for p in list_checkpoints(self.root)
                     if resumed_from is not None and iteration_of(p) <= resumed_from}
        self._queue = None
        _quiet_writer_failures()
        # megatron's Manager (started by the first save, sync or async) and the writers must not outlive a killed
        # trainer
        ensure_orphan_watchdog()
        if async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self._queue = AsyncCallsQueue(persistent=False)
            _become_subreaper()

    # ---------------------------------------------------------------- save
    def _sharded_state(self, chunks, optimizer, load: bool, with_rng: bool) -> Dict[str, Any]:
        state = model_sharded_state_dict(chunks)
        if optimizer is not None:
            state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=load, metadata=OPTIM_METADATA)
        if with_rng:
            state["rng_state"] = _rng_sharded_object(load)
        return state

    def save(self, chunks, optimizer, scheduler, train_state: TrainState, data_state: Optional[Dict],
             config: Dict[str, Any]) -> Path:
        """Save iteration `train_state.iteration`; `latest` moves only once every rank has finished."""
        if self.async_save and not _ASYNC_STRATEGY:
            _ASYNC_STRATEGY.update(_async_strategy_kwargs())
        self.wait()  # one save in flight at a time
        target = self.root / iter_dir_name(train_state.iteration)
        rank = dist.get_rank()
        if rank == 0:
            try:
                if target.exists():  # a leftover of a crashed save, or a damaged checkpoint `latest` was moved past
                    shutil.rmtree(target)
                target.mkdir(parents=True)
            except OSError as e:
                self._raise_if_storage_failed(e)
                raise
        dist.barrier()
        state = self._sharded_state(chunks, optimizer, load=False, with_rng=True)
        state.update(
            scheduler=scheduler.state_dict() if scheduler is not None else None,
            train_state=vars(train_state).copy(),
            data=data_state,
            config=config,
        )
        with stop_signals_blocked():  # the Manager this save may start, and an async writer, inherit them blocked
            request = self._write_shards(state, target)
        notice_helpers()  # the Manager this save may have started
        # a snapshot: an async finalize runs steps later, when the live TrainState has moved on
        saved_state = TrainState(**vars(train_state))
        finalize = lambda: self._finalize(target, saved_state, has_optimizer=optimizer is not None)  # noqa: E731
        if self.async_save:
            request.add_finalize_fn(finalize)
            with stop_signals_blocked():
                self._schedule(request, target)
            if dist.get_rank() == 0:
                self.log(f"[checkpoint] writing {target} (iteration {saved_state.iteration}) in the background")
        else:
            finalize()
        return target

    # _write_shards and _schedule are the save's two steps before its commit (`_finalize`): the seams the
    # crash tests wrap (tests/training/faults.py) to die mid-save.
    def _write_shards(self, state: Dict[str, Any], target: Path):
        """Write this rank's shards of `state` into `target` (async: returns the request that will)."""
        from megatron.core import dist_checkpointing

        try:
            return dist_checkpointing.save(state, str(target), async_sharded_save=self.async_save, **_ASYNC_STRATEGY)
        except BaseException as e:  # torch's CheckpointException is a BaseException
            self._raise_if_storage_failed(e)
            raise

    def _schedule(self, request, target: Path) -> None:
        """Start an async save's background writer (megatron-core forks it)."""
        self._queue.schedule_async_request(request)
        notice_helpers()  # the writer just forked
        self._in_flight = target

    def _finalize(self, target: Path, train_state: TrainState, has_optimizer: bool) -> None:
        dist.barrier()  # every rank's shards (and rank 0's metadata) are on disk
        start = time.perf_counter()
        files = _checksums(target)
        if dist.get_rank() == 0:
            record = CheckpointRecord(**vars(train_state), layout=_layout(), has_optimizer=has_optimizer, files=files)
            write_atomic(target / STATE_JSON, record.to_json())
            write_atomic(self.root / LATEST, target.name + "\n")
            write_atomic(self.root / TRAINER_LATEST, target.name + "\n")  # after: see lookup.py
            self._own.add(target.name)
            self._prune(keep_name=target.name)
            self.log(f"[checkpoint] saved {target} (iteration {train_state.iteration}); checksums of {len(files)} "
                     f"files in {time.perf_counter() - start:.2f} s")
        dist.barrier()

    def _prune(self, keep_name: str) -> None:
        """Keep the newest `keep` checkpoints of this run's history; remove older unfinished saves."""
        own = [p for p in list_checkpoints(self.root) if p.name in self._own]
        for old in own[: max(0, len(own) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)
                self._own.discard(old.name)
        newest = iteration_of(Path(keep_name))
        for partial in self.root.glob("iter_*"):  # newer partials may be async saves still being written
            it = iteration_of(partial)
            if it is not None and it < newest and not (partial / STATE_JSON).exists():
                shutil.rmtree(partial, ignore_errors=True)

    def _raise_if_storage_failed(self, error: BaseException) -> None:
        from cplm_megatron.checkpoint.storage import save_failure_message

        if isinstance(error, (KeyboardInterrupt, SystemExit, CheckpointError)):
            return
        message = save_failure_message(self.root, self.checkpoint_size, error)
        if message is not None:
            self._broken = True
            raise CheckpointError(message) from error

    def _writers(self):
        """The processes of the in-flight async saves (megatron-core's TemporalAsyncCaller forks one per save)."""
        calls = getattr(self._queue, "async_calls", ()) if self._queue is not None else ()
        return [p for call in calls for p in [getattr(getattr(call, "async_caller", None), "process", None)]
                if p is not None]

    def _writer_pids(self):
        return [p.pid for p in self._writers() if p.pid is not None]

    def _check_writers(self) -> bool:
        """Collective: whether a writer is still running on any rank. A writer that died (killed, out of
        memory) on any rank stops every rank with one line; megatron-core would otherwise fail with
        "results_queue should not be empty" or wait forever."""
        if self._queue is None or not getattr(self._queue, "async_calls", None):
            return False
        writers = self._writers()
        dead = [p for p in writers if not p.is_alive() and p.exitcode not in (0, None)]
        flags = torch.tensor([1 if dead else 0, 1 if any(p.is_alive() for p in writers) else 0], dtype=torch.int32)
        if dist.get_backend() == "nccl":
            flags = flags.cuda()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0].item():
            self._broken = True
            previous = read_latest_name(self.root)
            who = (f"process {dead[0].pid} ({_exit_text(dead[0].exitcode)}) on rank {dist.get_rank()}" if dead
                   else "its process on another rank")
            raise CheckpointWriterDied(
                f"the background checkpoint writer of {self._in_flight} died: {who}; that save is incomplete "
                f"and latest still names {previous or 'no checkpoint'}: relaunch to resume from it (if this "
                f"repeats, check the host's memory and set checkpoint.async_save=false)")
        return bool(flags[1].item())

    def poll(self) -> None:
        """Finalize finished async saves (non-blocking)."""
        if self._queue is not None and not self._broken:
            self._check_writers()
            self._finalize_finished(blocking=False)

    def wait(self) -> None:
        """Block until every in-flight async save is finalized."""
        if self._queue is None or self._broken:
            return
        while self._check_writers():  # poll (collectively), so a writer that dies is noticed
            time.sleep(0.05)
        self._finalize_finished(blocking=True)

    def _finalize_finished(self, blocking: bool) -> None:
        """Run the finalize step of the async saves whose writers finished (`blocking`: wait for all)."""
        try:
            self._queue.maybe_finalize_async_calls(blocking=blocking)
        except BaseException as e:  # torch's CheckpointException is a BaseException
            self._raise_if_storage_failed(e)
            raise

    def close(self) -> None:
        """Finish the in-flight saves (skipped after a failed one) and stop the async machinery."""
        if self._queue is None:
            return
        if self._broken:
            for p in self._writers():
                if p.is_alive():
                    p.kill()
                p.join(timeout=5)
            self._queue.async_calls.clear()
            return
        self.wait()
        self._queue.close()

    # ---------------------------------------------------------------- load
    def load(self, path: Path, chunks, optimizer, scheduler, load_optimizer: bool = True) -> Dict[str, Any]:
        """Restore model (+ optimizer, scheduler, RNG when the layout matches) from `path`.

        Returns {'train_state': TrainState, 'data': loader state or None, 'config': saved config,
        'same_layout': bool, 'saved_layout' and 'layout': {'tp', 'pp', 'cp', 'dp'} then and now}.
        """
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.core import CheckpointingException
        from torch.distributed.checkpoint.api import CheckpointException

        record = read_record(path)
        _verify_contents(path, record)
        if load_optimizer and optimizer is not None and not record.has_optimizer:
            raise CheckpointError(
                f"checkpoint {path} holds weights only (converted or exported), no optimizer state; "
                f"start from it with checkpoint.load={Path(path).parent} checkpoint.load_optimizer=false"
            )
        saved, layout = record.layout, _layout()
        same_layout = saved == layout  # RNG states are per (tp, pp, cp) rank: restored only under the saving layout
        if optimizer is not None and load_optimizer:
            for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
                if hasattr(opt, "_init_optimizer_states_with_dummy_values"):
                    opt._init_optimizer_states_with_dummy_values()  # a never-stepped distributed optimizer
        with_rng = same_layout and load_optimizer  # weights-only loads (fine-tuning, conversions) keep fresh RNG
        state = self._sharded_state(chunks, optimizer if load_optimizer else None, load=True, with_rng=with_rng)
        try:
            with warnings.catch_warnings():  # megatron-core's own deprecated calls (load_state_dict, ShardedTensor)
                warnings.filterwarnings("ignore", category=FutureWarning)
                loaded = dist_checkpointing.load(state, str(path))
        except (CheckpointingException, CheckpointException) as e:
            raise CheckpointError(f"cannot load checkpoint {path} into this model: {type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''}") from e
        load_model_state(chunks, loaded)
        if optimizer is not None and load_optimizer:
            optimizer.load_state_dict(loaded["optimizer"])
            if scheduler is not None and loaded.get("scheduler") is not None:
                scheduler.load_state_dict(loaded["scheduler"])
        if with_rng and loaded.get("rng_state") is not None:
            _restore_rng(loaded["rng_state"])
        ts = TrainState(**loaded["train_state"]) if load_optimizer else TrainState()
        return {"train_state": ts, "data": loaded.get("data") if load_optimizer else None,
                "config": loaded.get("config"), "same_layout": same_layout, "saved_layout": saved,
                "layout": layout}


def _checksums(target: Path) -> Dict[str, Dict[str, Any]]:
    """Collective: the checksums of a saved checkpoint's files (every rank reads its share of them); rank 0 gets
    them all, the other ranks an empty dict."""
    rank, world = dist.get_rank(), dist.get_world_size()
    names = [checkpoint_files(target) if rank == 0 else None]
    dist.broadcast_object_list(names, src=0)
    mine = checksum_files(target, names[0][rank::world])
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return {name: entry for part in gathered or [] for name, entry in part.items()}


def _verify_contents(path: Path, record: CheckpointRecord) -> None:
    """Collective: every rank checks its share of the checkpoint's files against the checksums recorded when it was
    saved; a difference anywhere is one CheckpointError on every rank, naming the previous intact checkpoint."""
    names = sorted(record.files or {})
    rank, world = dist.get_rank(), dist.get_world_size()
    found = [None] * world
    dist.all_gather_object(found, content_damage(path, record, names[rank::world]))
    problems = sorted(p for part in found for p in part)
    if problems:
        message = [damaged_contents_message(Path(path), problems) if rank == 0 else None]
        dist.broadcast_object_list(message, src=0)
        raise CheckpointError(message[0])


def read_latest_name(root: Path) -> Optional[str]:
    """What `latest` holds (None without one)."""
    try:
        return (Path(root) / LATEST).read_text().strip() or None
    except OSError:
        return None


def _exit_text(code: Optional[int]) -> str:
    import signal

    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
