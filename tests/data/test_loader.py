"""The single-process loader: batch contract on real data, exact resume, mixtures, validation passes."""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.loader import build_train_loader, build_val_loader
from cplm_megatron.data.manifest import DatasetError
from tests.data_fixtures import TinyCorpus, numbered_docs, write_synthetic_dataset
from tests.harness import Call, run_cases

pytestmark = pytest.mark.usefixtures("isolated_streaming")
SEQ = 16


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """'main': 48 samples; 'a'/'b': 40 samples each with token ids in disjoint ranges."""
    root = tmp_path_factory.mktemp("loader-data")
    write_synthetic_dataset(root / "main", numbered_docs(48, SEQ, doc_len=21), SEQ, shard_size_limit=1 << 9)
    write_synthetic_dataset(root / "a", numbered_docs(40, SEQ, doc_len=13, first_token=1), SEQ)
    write_synthetic_dataset(root / "b", numbered_docs(40, SEQ, doc_len=13, first_token=2000), SEQ)
    return {name: root / name for name in ("main", "a", "b")}


def sample_keys(batch: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """One hashable id per sample (ids are unique per sample in the synthetic data)."""
    return [tuple(row.tolist()) for row in batch["tokens"]]


def draw(loader, count: int) -> list[tuple[int, ...]]:
    return [key for _ in range(count) for key in sample_keys(next(loader))]


def cfg_for(*paths: Path, **overrides) -> DataConfig:
    values = {"seed": 7, "streams": [{"path": str(p)} for p in paths]}
    return DataConfig(**{**values, **overrides})


def shape(micro_batch: int = 2) -> BatchShape:
    """SEQ-token samples, `micro_batch` per micro-batch and per step (one process)."""
    return BatchShape(SEQ, micro_batch, micro_batch)


def test_batches_on_a_real_corpus_follow_the_contract(tiny_corpus: TinyCorpus) -> None:
    cfg = DataConfig(streams=[{"path": str(tiny_corpus.dataset_dir)}])
    batch = next(build_train_loader(cfg, BatchShape(tiny_corpus.seq_len, 8, 8), 0, 1,
                                    model_vocab_size=tiny_corpus.tokenizer.vocab_size))
    assert {k: (tuple(v.shape), v.dtype) for k, v in batch.items()} == {
        "tokens": ((8, 64), torch.int64), "labels": ((8, 64), torch.int64), "loss_mask": ((8, 64), torch.float32),
        "position_ids": ((8, 64), torch.int64), "document_ids": ((8, 64), torch.int64)}
    # integer tokens and boolean masks: exact
    assert torch.equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])
    eod = tiny_corpus.tokenizer.eod_id
    follows_eod = torch.zeros_like(batch["tokens"], dtype=torch.bool)
    follows_eod[:, 1:] = batch["tokens"][:, :-1] == eod
    real = torch.ones_like(follows_eod)  # input positions before any EOD padding
    real[:, 1:] = batch["loss_mask"][:, :-1] == 1
    starts = follows_eod | (torch.arange(64) == 0)
    assert torch.equal((batch["position_ids"] == 0)[real], starts[real])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_reproduces_the_remaining_sequence(datasets: dict[str, Path], num_workers: int) -> None:
    cfg = cfg_for(datasets["main"], num_workers=num_workers)
    reference = build_train_loader(cfg, shape(), 0, 1)
    assert reference.micro_batches_per_epoch == 24
    uninterrupted = draw(reference, 60)  # 2.5 epochs
    epochs = [uninterrupted[0:48], uninterrupted[48:96]]
    assert len(set(epochs[0])) == 48 and set(epochs[0]) == set(epochs[1])  # each epoch: every sample once
    assert epochs[0] != epochs[1]  # reshuffled per epoch
    assert epochs[0] != sorted(epochs[0])  # shuffled at all
    # Stop mid-epoch, exactly at the epoch's end (not yet known to be exhausted), and in epoch 1.
    for stop, (epoch, sample_in_epoch) in {17: (0, 34), 24: (0, 48), 31: (1, 14)}.items():
        first = build_train_loader(cfg, shape(), 0, 1)
        assert draw(first, stop) == uninterrupted[: 2 * stop]
        state = first.state_dict()
        assert (state["epoch"], state["sample_in_epoch"]) == (epoch, sample_in_epoch)
        resumed = build_train_loader(cfg, shape(), 0, 1)
        resumed.load_state_dict(dict(state))
        assert draw(resumed, 60 - stop) == uninterrupted[2 * stop :], f"resumed after {stop} micro-batches"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_needs_no_shared_memory_and_ignores_a_stale_position_there(
        datasets: dict[str, Path], num_workers: int) -> None:
    """streaming keeps a resume position only in /dev/shm/NNNNNN_resume until the first batch is drawn: a process
    cleaning stale segments in between (streaming's FAQ: clean_stale_shared_memory()) once made the loader restart
    the epoch at sample 0 without a word, and ranks creating it at once raced (issue 43 item 6). The position handed
    to load_state_dict is used as it is: no segment is written, and one left by another job is not read."""
    from multiprocessing.shared_memory import SharedMemory

    cfg = cfg_for(datasets["main"], num_workers=num_workers)
    uninterrupted = draw(build_train_loader(cfg, shape(), 0, 1), 30)
    first = build_train_loader(cfg, shape(), 0, 1)
    draw(first, 7)
    resumed = build_train_loader(cfg, shape(), 0, 1)
    resumed.load_state_dict(first.state_dict())
    segment = f"{resumed.dataset._shm_prefix_int:06}_resume"
    assert not (Path("/dev/shm") / segment).exists()
    stale = SharedMemory(segment, create=True, size=4096)  # another job's position at this prefix
    stale.buf[:64] = b'{"epoch": 0, "sample_in_epoch": 2, "num_canonical_nodes": 1}\0'.ljust(64, b"\0")
    try:
        assert draw(resumed, 23) == uninterrupted[14:]  # the rest of epoch 0, then epoch 1 as uninterrupted
    finally:
        stale.close()
        stale.unlink()


def test_state_dict_is_plain_and_guards_misuse(datasets: dict[str, Path]) -> None:
    loader = build_train_loader(cfg_for(datasets["main"]), shape(), 0, 1)
    state = loader.state_dict()
    assert all(isinstance(v, (int, str)) for v in state.values())
    next(loader)
    with pytest.raises(RuntimeError, match="before the first batch"):
        loader.load_state_dict(state)
    with pytest.raises(DatasetError, match=r"data seed is 7 but data.seed is 8"):
        build_train_loader(cfg_for(datasets["main"], seed=8), shape(), 0, 1).load_state_dict(state)
    with pytest.raises(DatasetError, match=r"epoch had 48 samples, the configured streams give 40"):
        build_train_loader(cfg_for(datasets["a"]), shape(), 0, 1).load_state_dict(state)


def test_mixture_proportions_are_exact_per_epoch(datasets: dict[str, Path]) -> None:
    cfg = cfg_for(datasets["a"], datasets["b"], epoch_size=64)
    cfg.streams[0].proportion, cfg.streams[1].proportion = 0.75, 0.25
    loader = build_train_loader(cfg, shape(4), 0, 1)
    assert loader.micro_batches_per_epoch == 16
    for _ in range(2):
        keys = draw(loader, 16)
        sources = Counter("a" if max(key) < 2000 else "b" for key in keys)  # b's ids start at 2000
        assert sources == {"a": 48, "b": 16}
        assert len({k for k in keys if max(k) < 2000}) == 40  # 48 > 40: stream a is upsampled, all seen


def test_repeat_and_choose_weights(datasets: dict[str, Path]) -> None:
    cfg = cfg_for(datasets["a"], datasets["b"])
    cfg.streams[0].repeat, cfg.streams[1].choose = 2.0, 10
    loader = build_train_loader(cfg, shape(5), 0, 1)
    keys = draw(loader, loader.micro_batches_per_epoch)
    assert Counter("a" if max(k) < 2000 else "b" for k in keys) == {"a": 80, "b": 10}


def test_validation_passes_are_identical_and_unshuffled(datasets: dict[str, Path]) -> None:
    cfg = cfg_for(val_streams=[{"path": str(datasets["main"])}])
    val = build_val_loader(cfg, shape(4), 0, 1)
    assert len(val) == 12
    first = [k for batch in val for k in sample_keys(batch)]
    second = [k for batch in val for k in sample_keys(batch)]
    assert first == second == sorted(first) and len(set(first)) == 48


def test_cache_dir_keeps_a_local_dataset_untouched(datasets: dict[str, Path], tmp_path: Path) -> None:
    source = tmp_path / "src"
    write_synthetic_dataset(source, numbered_docs(8, SEQ, doc_len=21), SEQ)
    before = sorted(os.listdir(source))
    cfg = cfg_for(source, cache_dir=str(tmp_path / "cache"))
    keys = draw(build_train_loader(cfg, shape(), 0, 1), 4)
    assert len(set(keys)) == 8
    assert sorted(os.listdir(source)) == before
    assert list((tmp_path / "cache").glob("*/shard.*.mds"))  # decompressed in the cache instead


def _open_repeatedly(rank: int, cfg: DataConfig, start_at: float, times: int) -> int:
    """A lone process (no process group) opening and reading a validation loader `times` times."""
    while time.time() < start_at:
        time.sleep(0.001)
    for _ in range(times):
        next(iter(build_val_loader(cfg, shape(4), 0, 1)))
    return times


@pytest.mark.slow
def test_jobs_opening_datasets_at_the_same_moment_all_succeed(datasets: dict[str, Path]) -> None:
    """Streaming probes /dev/shm for a free name and then creates it; independent jobs of one machine
    (a study's runs, an evaluation beside training) opening at once must not collide."""
    cfg = cfg_for(val_streams=[{"path": str(datasets["main"])}])
    opened = run_cases([Call("open", _open_repeatedly, (cfg, time.time() + 3.0, 8))], 4)["open"]
    assert opened == [8] * 4


def test_a_prefix_taken_by_another_process_is_retried_with_fresh_streams(
        datasets: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A process outside the machine-wide lock may win streaming's prefix race; the retry must not reuse
    the Stream objects streaming already wrote its weighting into."""
    import streaming.base.dataset as streaming_dataset

    real = streaming_dataset.get_shm_prefix
    raised = []

    def lose_the_race_once(*args, **kwargs):
        if not raised:
            raised.append(True)
            raise FileExistsError("/dev/shm/000000_locals")
        return real(*args, **kwargs)

    monkeypatch.setattr(streaming_dataset, "get_shm_prefix", lose_the_race_once)
    cfg = cfg_for(datasets["a"], datasets["b"])
    cfg.streams[0].repeat, cfg.streams[1].choose = 2.0, 10
    loader = build_train_loader(cfg, shape(5), 0, 1)
    assert raised and Counter("a" if max(k) < 2000 else "b" for k in draw(loader, loader.micro_batches_per_epoch)) \
        == {"a": 80, "b": 10}
