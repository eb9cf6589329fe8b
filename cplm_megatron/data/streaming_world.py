"""Run StreamingDataset under Megatron's process grid: shard by data-parallel rank, coordinate by node.

Streaming uses one "world" for two jobs (see streaming/base/dataset.py, world.py):

* coordination: per physical machine, one local leader creates shared memory (``/dev/shm``) and
  computes each epoch's sample order; the processes of that machine attach to it and meet at
  shared-memory barriers. It reads RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE and assumes
  the ranks of one machine are consecutive.
* iteration: which slice of the epoch a process reads. `replication` can give *consecutive*
  ranks the same slice, but Megatron's data-parallel peers are not consecutive (pipeline stages
  are the outermost dimension), and they may live on different machines.

So we keep the coordination world physical, taken from the process group itself (ranks grouped
by machine), and replace the iteration world by the data-parallel view: a single virtual node of
`dp_size` ranks where this process is rank `dp_rank`. Every TP/PP peer of a DP rank reads the
same slice; different DP ranks read disjoint slices.

Consequences for callers: building a dataset runs barriers on the default process group and every
process of a machine meets at each epoch start, so *all ranks* must build the same loaders in the
same order and iterate them in step (Megatron does: every rank pulls the same micro-batches).
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from math import ceil
from pathlib import Path
from typing import Any

from cplm_megatron.data._streaming_import import TICK, ShardState, StreamingDataset, World
from cplm_megatron.data.stop import StopRequested, stop_signal

_WORLD_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class NodeLayout:
    """This process's place among the processes of its machine."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def machine_id() -> str:
    """Identifies the machine (and so its /dev/shm): hostname plus kernel boot id."""
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    boot = boot_id.read_text().strip() if boot_id.is_file() else ""
    return f"{socket.gethostname()}/{boot}"


def layout_from_machines(machines: Sequence[str], rank: int) -> NodeLayout:
    """Node layout of `rank` given every rank's machine id; streaming needs machines to hold equal,
    consecutive blocks of ranks (as torchrun and SLURM's block distribution give)."""
    world_size = len(machines)
    mine = [r for r, m in enumerate(machines) if m == machines[rank]]
    local_world_size = len(mine)
    first = mine[0]
    consecutive = mine == list(range(first, first + local_world_size))
    if not consecutive or first % local_world_size or world_size % local_world_size:
        raise RuntimeError(
            f"ranks {mine} share machine {machines[rank]!r}, but the streaming data loader needs each "
            f"machine to hold an equal block of consecutive ranks (world size {world_size}); launch "
            f"with torchrun or SLURM block distribution (--distribution=block)"
        )
    for start in range(0, world_size, local_world_size):
        block = set(machines[start : start + local_world_size])
        if len(block) != 1:
            raise RuntimeError(
                f"ranks {start}..{start + local_world_size - 1} span machines {sorted(block)}; the "
                f"streaming data loader needs every machine to run {local_world_size} consecutive ranks"
            )
    return NodeLayout(rank, world_size, rank - first, local_world_size)


def detect_node_layout() -> NodeLayout:
    """This process's node layout; a collective over the default process group when there is one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return NodeLayout(0, 1, 0, 1)
    machines: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(machines, machine_id())
    return layout_from_machines([str(m) for m in machines], dist.get_rank())


@contextmanager
def streaming_world_env(layout: NodeLayout) -> Iterator[None]:
    """Set the environment streaming's `World.detect()` reads to `layout`; restore it after."""
    saved = {key: os.environ.get(key) for key in _WORLD_ENV}
    values = (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size)
    os.environ.update({key: str(value) for key, value in zip(_WORLD_ENV, values, strict=True)})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _open_lock_path() -> Path:
    """The lock file that orders dataset construction on this machine: next to the segments it protects."""
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())) / "cplm-streaming-open.lock"


LOCK_LOG_AFTER_S = 5.0
LOCK_GIVE_UP_AFTER_S = 900.0



def _open_lock_file(path: Path) -> Any:
    """The lock file, group/world-writable (every user's jobs on a shared node order on it); a foreign one this
    user may not open is replaced by a per-user one beside it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    except PermissionError:
        fd = os.open(path.with_name(f"{path.stem}-uid{os.getuid()}{path.suffix}"), os.O_CREAT | os.O_RDWR, 0o666)
    try:
        os.fchmod(fd, 0o666)  # the umask took write access away from the others
    except PermissionError:  # another user's file, already open to us
        pass
    return os.fdopen(fd, "r+")


def take_open_lock(path: Path, log_after_s: float = LOCK_LOG_AFTER_S,
                   give_up_after_s: float = LOCK_GIVE_UP_AFTER_S) -> Any:
    """Hold the machine's dataset lock at `path` (an open file); says so after `log_after_s` of waiting and raises
    DatasetError after `give_up_after_s`."""
    from cplm_megatron.data.manifest import DatasetError

    lock = _open_lock_file(path)
    started, logged = time.monotonic(), False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError:
            waited = time.monotonic() - started
            signum = stop_signal()
            if signum is not None:
                lock.close()
                raise StopRequested(f"stopped by signal {signum} after {waited:.0f} s of waiting for the dataset lock "
                                    f"{path} (another job on this machine is opening its datasets): nothing was "
                                    f"trained or written; relaunch to continue") from None
            if waited > give_up_after_s:
                lock.close()
                raise DatasetError(
                    f"waited {waited:.0f} s for the dataset lock {path}, held by another job on this machine that "
                    f"is building its datasets (or hung doing so); find it with `fuser {path}` and stop it, "
                    f"then relaunch") from None
            if waited > log_after_s and not logged:
                print(f"[data] waiting for the dataset lock {path}: another job on this machine is opening its "
                      f"datasets (giving up after {give_up_after_s:.0f} s)", flush=True)
                logged = True
            time.sleep(0.1)


SHM_DIR = Path("/dev/shm")
SHM_FLOOR_BYTES = 1 << 20  # streaming's small segments (locals, barriers, shard states, resume) with headroom


def _gib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def check_shared_memory(need_bytes: int, shm_dir: Path = SHM_DIR) -> None:
    """Raise DatasetError unless `shm_dir` is writable and has room for `need_bytes` more: streaming writes to
    segments it mapped there, and a full tmpfs kills the process with SIGBUS (a bare `Bus error`)."""
    from cplm_megatron.data.manifest import DatasetError

    probe = shm_dir / f"cplm-shm-probe-{socket.gethostname()}-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o600)
    except OSError as e:
        raise DatasetError(
            f"cannot create files in {shm_dir} ({e.strerror}): the streaming data loader keeps each epoch's sample "
            f"order and its barriers in shared memory there; make it writable (mount -o remount,rw {shm_dir}) or "
            f"run on a node where it is") from None
    try:
        try:
            os.posix_fallocate(fd, 0, max(int(need_bytes), 1))  # reserves the pages: fails now, not SIGBUS later
            return
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            free = shutil.disk_usage(shm_dir).free
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL) and free >= need_bytes:  # no fallocate: free space
                return
        raise DatasetError(
            f"{shm_dir} is full ({_gib(free)} free, the data loader needs about {_gib(need_bytes)}): remove the "
            f"segments of jobs that no longer run (`ls -lt {shm_dir}`; streaming names them NNNNNN_*) or give the "
            f"job a larger {shm_dir} (docker/podman --shm-size, a larger tmpfs)")
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


@contextmanager
def one_open_at_a_time(layout: NodeLayout) -> Iterator[None]:
    """Build StreamingDatasets one job at a time on this machine.

    Streaming picks its shared-memory prefix by probing /dev/shm for a free name and then creating it,
    so two jobs opening datasets at the same moment can pick the same prefix (FileExistsError on
    /dev/shm/NNNNNN_locals). The local leader holds an flock (released by the kernel if the process
    dies) while its job's ranks build; they start only once it holds it, so construction stays collective.
    """
    import torch.distributed as dist

    from cplm_megatron.data.manifest import DatasetError

    peers = layout.world_size > 1 and dist.is_available() and dist.is_initialized()
    lock = None
    try:
        problem = None
        if layout.local_rank == 0:
            try:
                lock = take_open_lock(_open_lock_path())
                check_shared_memory(SHM_FLOOR_BYTES)
            except (DatasetError, StopRequested) as e:
                problem = (type(e).__name__, str(e))
        problems: list[Any] = [problem]
        if peers:  # every rank refuses (or stops) together (a rank left waiting in a collective would hang)
            problems = [None] * dist.get_world_size()
            dist.all_gather_object(problems, problem)
        found = next((p for p in problems if p), None)
        if found:
            raise (StopRequested if found[0] == "StopRequested" else DatasetError)(found[1])
        yield
        if peers:
            dist.barrier()
    finally:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


def _shard_failure(error: BaseException) -> Any:
    """The DatasetError for streaming's error about a corrupt (checksum) or missing shard; None for other errors."""
    from cplm_megatron.data.manifest import DatasetError

    if isinstance(error, DatasetError):
        return error
    text = str(error)
    if isinstance(error, ValueError) and text.startswith("Checksum failure: "):
        return DatasetError(
            f"shard corrupt: {text[len('Checksum failure: '):]} does not match the checksum in its dataset's "
            f"index.json (damaged after it was written); re-run tools/prepare_data.py (it checks the shards and "
            f"rebuilds damaged ones), or keep data.verify_shards=true to find it at start")
    if isinstance(error, FileNotFoundError):
        return DatasetError(f"shard missing: {text}; re-run tools/prepare_data.py to rebuild the dataset")
    return None


class DataParallelStreamingDataset(StreamingDataset):
    """A StreamingDataset that partitions each epoch over data-parallel ranks, not global ranks.

    Construct it inside `streaming_world_env(detect_node_layout())`. Relies on streaming 0.13's
    `_parallel_rank_world` (the iteration world) and `length`; checked here so an upgrade that
    renames them fails loudly instead of silently sharding by global rank.
    """

    def __init__(self, *, dp_rank: int, dp_size: int, **kwargs: Any):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
        if kwargs.get("replication") is not None:
            raise ValueError("replication is replaced by dp_rank/dp_size here; do not pass it")
        super().__init__(**kwargs)
        if not isinstance(getattr(self, "_parallel_rank_world", None), World) or not hasattr(self, "length"):
            raise RuntimeError(
                "this mosaicml-streaming version has no StreamingDataset._parallel_rank_world/length; "
                "the data-parallel sharding in cplm_megatron.data.streaming_world needs streaming 0.13"
            )
        self._parallel_rank_world = World(num_nodes=1, ranks_per_node=dp_size, workers_per_rank=1, worker=dp_rank)
        self.length = ceil(self.epoch_size / dp_size)
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Resume at `obj` (streaming's state dict). The position is kept on this object (copied into DataLoader
        workers) and never in /dev/shm: streaming writes it to the segment /dev/shm/NNNNNN_resume, which every rank
        of a machine creates or attaches at once (a rank finding it created, then removed before it attaches, failed
        with FileNotFoundError and left the others waiting: upstream's PR #966 makes the non-leaders wait), and
        which anything cleaning /dev/shm before the first batch removed (the epoch silently restarted at 0)."""
        self._handed_resume = dict(obj)

    def _resume(self, world: World, epoch: int) -> tuple[int, int]:
        """streaming's `_resume` (the position a `load_state_dict` left in /dev/shm), except that a position handed
        to `load_state_dict` is used as it is, without /dev/shm."""
        handed = getattr(self, "_handed_resume", None)
        if handed is None:
            return super()._resume(world, epoch)
        self.num_canonical_nodes = handed["num_canonical_nodes"]
        self.shuffle_seed = handed["shuffle_seed"]
        self.initial_physical_nodes = handed.get("initial_physical_nodes")
        self._set_shuffle_block_size(world)
        return (epoch, 0) if handed["epoch"] < epoch else (handed["epoch"], handed["sample_in_epoch"])

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        """streaming's prepare_shard, except that a blocking wait gives up once the download thread has
        failed (streaming 0.13 waits forever on a shard whose download or checksum raised), and a corrupt or
        missing shard is a DatasetError naming it."""
        try:
            super().prepare_shard(shard_id, blocking=False)
        except (ValueError, FileNotFoundError) as e:
            failure = _shard_failure(e)
            if failure is None:
                raise
            raise failure from None
        while blocking and self._shard_states[shard_id] == ShardState.PREPARING:
            if getattr(self, "_event", None) is not None and self._event.is_set():
                self._raise_thread_error()
                raise RuntimeError(
                    f"streaming's download thread failed while preparing shard {shard_id}"
                    " (a corrupt or missing shard, or an unreachable remote)"
                )
            time.sleep(TICK)

    def _share_work(self, sample_ids: Any) -> Any:
        """streaming's `_share_work` (the local leader puts an epoch's sample order into /dev/shm), once /dev/shm
        has room for it: writing to a segment of a full /dev/shm kills the process with SIGBUS."""
        check_shared_memory(int(sample_ids.nbytes) + (64 << 10))
        return super()._share_work(sample_ids)

    def get_item(self, sample_id: int, retry: int = 7) -> Any:
        """streaming's get_item; a sample whose bytes do not decode (a shard damaged after it was checked, or never
        checked with data.verify_shards=false) is a DatasetError naming the shard and the sample."""
        from cplm_megatron.data.manifest import DatasetError

        try:
            return super().get_item(sample_id, retry)
        except DatasetError:
            raise
        except (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error, UnicodeDecodeError) as e:
            shard_id, index = self.spanner[sample_id]
            reader = self.shards[shard_id]
            path = Path(reader.dirname, reader.split or "", reader.raw_data.basename)
            raise DatasetError(
                f"shard corrupt: sample {index} of {path} cannot be decoded ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); re-run tools/prepare_data.py (it checks the shards and "
                f"rebuilds damaged ones), or keep data.verify_shards=true to find it at start") from None

    def on_exception(self, future: Any) -> None:
        """streaming's callback for its download and ready threads: it re-raised their error inside the thread
        pool (a logged traceback nobody acts on); here the error is kept for the iterating thread to raise."""
        error = future.exception()
        if error is not None:
            self._thread_error = error
            self._event.set()

    def _raise_thread_error(self) -> None:
        """Raise what made streaming's download thread fail (a corrupt or missing shard: one DatasetError)."""
        error = getattr(self, "_thread_error", None)
        if error is None:
            return
        failure = _shard_failure(error)
        if failure is not None:
            raise failure from None
        raise RuntimeError(f"streaming failed to prepare a shard ({type(error).__name__}: {error}): a corrupt "
                           f"or missing shard, or an unreachable remote") from error

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """streaming's iteration; a failure of its download thread ends it with that failure, not short."""
        try:
            yield from super().__iter__()
        except RuntimeError:  # streaming's "Background thread failed. Check other traceback."
            self._raise_thread_error()
            raise
        self._raise_thread_error()
