"""Data-parallel sharding with real processes: TP/PP peers get identical batches, DP ranks disjoint ones.

Four processes stand for TP=2 x DP=2 with the peers of a DP rank deliberately *not* consecutive
(ranks 0,2 -> dp 0 and 1,3 -> dp 1, as when pipeline stages are the outer dimension). They share
one machine, so streaming's shared memory and barriers are exercised, and have no RANK/WORLD_SIZE
environment: the node layout comes from the process group.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.data_fixtures import numbered_docs, run_processes, write_synthetic_dataset

SEQ = 16
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


def _rank_main(rank: int, dataset: str, stop: int) -> dict:
    from cplm_megatron.data.config import BatchShape, DataConfig
    from cplm_megatron.data.loader import build_train_loader, build_val_loader

    dp_rank, dp_size = rank % 2, 2
    cfg = DataConfig(streams=[{"path": dataset}], val_streams=[{"path": dataset}], seed=11)
    shape = BatchShape(SEQ, micro_batch=2, global_batch=4)

    def keys(batch) -> list[tuple[int, ...]]:
        return [tuple(row.tolist()) for row in batch["tokens"]]

    loader = build_train_loader(cfg, shape, dp_rank, dp_size)
    draws = [keys(next(loader)) for _ in range(loader.micro_batches_per_epoch + 4)]
    val = build_val_loader(cfg, shape, dp_rank, dp_size)
    val_keys = [k for batch in val for k in keys(batch)]
    first = build_train_loader(cfg, shape, dp_rank, dp_size)
    for _ in range(stop):
        next(first)
    state = first.state_dict()
    resumed = build_train_loader(cfg, shape, dp_rank, dp_size)
    resumed.load_state_dict(state)
    rest = [keys(next(resumed)) for _ in range(len(draws) - stop)]
    return {"draws": draws, "per_epoch": loader.micro_batches_per_epoch, "val": val_keys, "state": state,
            "rest": rest}


def test_tp_peers_identical_dp_ranks_disjoint_and_resume(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path / "ds", numbered_docs(48, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 9)
    stop = 5
    results = run_processes(_rank_main, 4, str(tmp_path / "ds"), stop)
    assert results[0] == results[2] and results[1] == results[3]  # TP peers: everything identical
    per_epoch = results[0]["per_epoch"]
    assert per_epoch == 12  # 48 samples / (2 ranks * 2 per micro-batch)
    epoch0 = [[k for batch in r["draws"][:per_epoch] for k in batch] for r in results[:2]]
    assert not set(epoch0[0]) & set(epoch0[1])
    assert len(set(epoch0[0]) | set(epoch0[1])) == 48  # the whole epoch
    assert not set(results[0]["val"]) & set(results[1]["val"])
    assert len(set(results[0]["val"]) | set(results[1]["val"])) == 48
    assert results[0]["state"] == results[1]["state"]  # one state for every rank
    assert results[0]["state"]["sample_in_epoch"] == stop * 2 * 2
    for r in results:
        assert r["rest"] == r["draws"][stop:]


def _resume_while_the_segment_goes(rank: int, dataset: str, stop: int) -> list:
    """DP=2 on one machine: both ranks resume; rank 1 does so the moment its segment lookup finds rank 0's resume
    segment and a cleaner removes it (streaming: create -> FileExistsError -> sleep -> attach -> FileNotFoundError;
    the race that failed 1 resume in 3 and left rank 0 waiting)."""
    import torch.distributed as dist
    from streaming.base.shared import memory

    from cplm_megatron.data.config import BatchShape, DataConfig
    from cplm_megatron.data.loader import build_train_loader

    cfg = DataConfig(streams=[{"path": dataset}], seed=11)
    shape = BatchShape(SEQ, micro_batch=2, global_batch=4)

    def keys(batch) -> list:
        return [tuple(row.tolist()) for row in batch["tokens"]]

    straight = build_train_loader(cfg, shape, rank, 2)
    draws = [keys(next(straight)) for _ in range(stop + 6)]
    first = build_train_loader(cfg, shape, rank, 2)
    for _ in range(stop):
        next(first)
    state = first.state_dict()
    resumed = build_train_loader(cfg, shape, rank, 2)
    segment = Path("/dev/shm") / f"{resumed.dataset._shm_prefix_int:06}_resume"
    if rank == 0:
        resumed.load_state_dict(state)
    dist.barrier()
    if rank == 1:
        sleep = memory.sleep
        memory.sleep = lambda seconds: (segment.unlink(missing_ok=True), sleep(seconds))
        try:
            resumed.load_state_dict(state)
        finally:
            memory.sleep = sleep
    dist.barrier()
    return [keys(next(resumed)) for _ in range(6)] == draws[stop:]


def test_dp2_resume_is_exact_when_the_resume_segment_is_removed_meanwhile(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path / "ds", numbered_docs(48, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 9)
    assert run_processes(_resume_while_the_segment_goes, 2, str(tmp_path / "ds"), 3) == [True, True]
