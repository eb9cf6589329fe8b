"""Training and validation micro-batch loaders over prepared datasets, for one data-parallel rank.

    loader = build_train_loader(cfg, shape, dp_rank, dp_size, model_vocab_size=padded_vocab)
    for _ in range(shape.num_microbatches(dp_size)):
        batch = next(loader)          # dict of [micro_batch, seq_len] tensors (see batch.py)
    checkpoint["data"] = loader.state_dict()   # plain dict of ints; identical on every rank

Streams are local directories or object-store URLs (``s3://bucket/prefix``, read through
streaming with ``S3_ENDPOINT_URL``/AWS credentials from the environment), mixed by
proportion/repeat/choose. Sharding follows the data-parallel rank and size given here, never
RANK/WORLD_SIZE (see streaming_world.py): TP/PP peers get identical batches, DP ranks disjoint ones.

Every rank must build the same loaders in the same order (construction runs collectives on the
default process group) and draw the same number of micro-batches. Every micro-batch's token ids are
checked against the tokenizer's vocabulary (and positions against seq_len), also with
`data.verify_shards=false`: a corrupt shard is a DatasetError, never an out-of-range embedding lookup.
"""
from __future__ import annotations

import copy
import hashlib
import random
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from functools import partial
from math import ceil
from pathlib import Path
from typing import Any

import torch

from cplm_megatron.data._streaming_import import Stream
from cplm_megatron.data.batch import collate_packed_samples
from cplm_megatron.data.config import BatchShape, DataConfig, StreamConfig
from cplm_megatron.data.manifest import (
    DatasetError,
    check_compatible,
    is_remote,
    read_manifest,
)
from cplm_megatron.data.shards import SHARD_HASH, verify_local_shards
from cplm_megatron.data.streaming_world import (
    DataParallelStreamingDataset,
    NodeLayout,
    detect_node_layout,
    one_open_at_a_time,
    streaming_world_env,
)
from cplm_megatron.data.tokenizer import TokenizerInfo

STATE_FORMAT = "cplm-train-loader/1"


def _cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else Path(tempfile.gettempdir()) / "cplm-streaming-cache"


def _open_streams(
    stream_cfgs: Sequence[StreamConfig],
    cfg: DataConfig,
    seq_len: int,
    model_vocab_size: int | None,
    role: str,
    layout: NodeLayout,
    also_check: Sequence[StreamConfig] = (),
) -> tuple[list[Stream], TokenizerInfo]:
    """Check every dataset's manifest (and local shards) against the run, then make its Stream.

    `also_check` streams (e.g. the training streams when opening validation ones) only take part
    in the consistency check (same tokenizer, seq_len, vocab). Shard hashes are checked by one
    process per machine (the others only check sizes), so a node reads each shard once."""
    if not stream_cfgs:
        raise DatasetError("no streams configured")
    cache_root = _cache_root(cfg)
    manifests = [(sc.label, read_manifest(sc.path, scratch_dir=cache_root)) for sc in stream_cfgs]
    others = [(sc.label, read_manifest(sc.path, scratch_dir=cache_root)) for sc in also_check]
    tokenizer = check_compatible(manifests + others, seq_len, model_vocab_size)
    streams = []
    for sc, (_, manifest) in zip(stream_cfgs, manifests, strict=True):
        weights = {"proportion": sc.proportion, "repeat": sc.repeat, "choose": sc.choose}
        source = sc.path
        if not is_remote(sc.path):
            source = str(Path(sc.path).resolve())
            verify_local_shards(Path(source), check_hashes=cfg.verify_shards and layout.local_rank == 0)
        if is_remote(source) or cfg.cache_dir:
            # Keyed by the dataset's fingerprint: a rebuilt dataset never meets a stale cache.
            source_hash = hashlib.blake2s(source.encode(), digest_size=8).hexdigest()
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", sc.name or "stream")
            # One cache per loader role: streaming refuses two live datasets sharing a cache directory.
            local = cache_root / f"{role}-{name}-{source_hash}-{manifest.fingerprint[:12]}"
            streams.append(Stream(remote=source, local=str(local), validate_hash=SHARD_HASH, **weights))
        else:  # read in place; streaming decompresses each shard next to its .zstd file on first use
            streams.append(Stream(local=source, validate_hash=SHARD_HASH, **weights))
    return streams, tokenizer


def _node_layout(dp_size: int) -> NodeLayout:
    import torch.distributed as dist

    if dp_size > 1 and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"dp_size={dp_size} needs torch.distributed to be initialized first")
    return detect_node_layout()


def _make_dataset(
    streams: list[Stream], cfg: DataConfig, micro_batch: int, dp_rank: int, dp_size: int, layout: NodeLayout, *,
    train: bool
) -> DataParallelStreamingDataset:
    attempts = 5 if layout.local_world_size == 1 else 1
    with one_open_at_a_time(layout):
        for attempt in range(attempts):
            try:
                # streaming writes its weighting into the Stream objects: every attempt gets fresh ones
                return _new_dataset(copy.deepcopy(streams), cfg, micro_batch, dp_rank, dp_size, layout, train=train)
            except FileExistsError:
                # A process outside this project claimed the same shared-memory prefix at the same moment;
                # a lone process can simply look again (peers of one job coordinate inside streaming).
                if attempt == attempts - 1:
                    raise
                time.sleep(0.2 + random.random())
    raise AssertionError("unreachable")


def _new_dataset(
    streams: list[Stream], cfg: DataConfig, micro_batch: int, dp_rank: int, dp_size: int, layout: NodeLayout, *,
    train: bool
) -> DataParallelStreamingDataset:
    with streaming_world_env(layout):
        return DataParallelStreamingDataset(
            dp_rank=dp_rank,
            dp_size=dp_size,
            streams=streams,
            batch_size=micro_batch,
            shuffle=cfg.shuffle if train else False,
            shuffle_seed=cfg.seed,
            num_canonical_nodes=1,  # fixed, so the sample order does not depend on the job's size
            partition_algo="orig",
            # Validation passes must all see the same samples, also when streams are resampled.
            sampling_method="balanced" if train else "fixed",
            epoch_size=cfg.epoch_size if train else None,
        )


def _batches_per_pass(epoch_size: int, start_sample: int, dp_size: int, micro_batch: int) -> int:
    """Full micro-batches each DP rank reads from an epoch resumed at `start_sample` (streaming's
    'orig' partition over one canonical node pads each rank to ceil(remaining / dp_size))."""
    return ceil(max(epoch_size - start_sample, 0) / dp_size) // micro_batch


def _short_pass_error(what: str, got: int, expected: int) -> RuntimeError:
    return RuntimeError(
        f"{what} ended after {got} of {expected} micro-batches: streaming failed to read or download a "
        f"shard (a corrupt or missing shard, or an unreachable remote; streaming logs the cause from its "
        f"download thread)"
    )


def _next_batch(batches: Iterator[dict[str, torch.Tensor]], what: str, index: int) -> dict[str, torch.Tensor] | None:
    """The next micro-batch, or None at the end of the pass; streaming's own read errors (raised from its
    download thread or its shard readers, in several forms) become one error naming where they happened."""
    try:
        return next(batches, None)
    except DatasetError:
        raise
    except (RuntimeError, OSError, ValueError) as e:  # streaming raises all three (checksum: ValueError)
        raise RuntimeError(
            f"{what}: streaming failed to read micro-batch {index} (a corrupt or missing shard, or an "
            f"unreachable remote; streaming logs the cause from its download thread): {e}"
        ) from e


class _Loader:
    """What the train and validation loaders share: the dataset, its DataLoader, batch geometry."""

    def __init__(self, dataset: DataParallelStreamingDataset, cfg: DataConfig, micro_batch: int,
                 tokenizer: TokenizerInfo, what: str, keep_last: bool = False, repeat_span_share: float = 0.0):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.micro_batch = micro_batch
        self.dp_size = dataset.dp_size
        self.epoch_size = int(dataset.epoch_size)
        collate = partial(
            collate_packed_samples,
            eod_id=tokenizer.eod_id,
            document_masking=cfg.document_masking,
            eod_mask_loss=cfg.eod_mask_loss,
            repeat_span_share=repeat_span_share,
            seed=cfg.seed,
        )
        self._dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=micro_batch, num_workers=cfg.num_workers, collate_fn=collate,
            drop_last=not keep_last,
        )
        if _batches_per_pass(self.epoch_size, 0, self.dp_size, self.micro_batch) == 0:
            raise DatasetError(
                f"{what} has {self.epoch_size} samples per epoch, fewer than micro_batch * dp_size = "
                f"{self.micro_batch} * {self.dp_size}: no full micro-batch per rank; use more data or a "
                f"smaller train.micro_batch"
            )

    def _checked(self, batch: dict[str, torch.Tensor], what: str, index: int) -> dict[str, torch.Tensor]:
        """The batch, if its token ids fit the tokenizer's vocabulary and its positions the sequence."""
        vocab = self.tokenizer.vocab_size
        extremes = [torch.aminmax(batch[key]) for key in ("tokens", "labels")]  # no stacked copy per micro-batch
        low, high = min(int(e.min) for e in extremes), max(int(e.max) for e in extremes)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise DatasetError(
                f"{what}: micro-batch {index} holds token id {bad}, outside the vocabulary of the dataset's "
                f"tokenizer ({self.tokenizer.name!r}, {vocab} tokens): a shard is corrupt; re-run "
                f"tools/prepare_data.py (it checks the shards and rebuilds damaged ones) or set "
                f"data.verify_shards=true to find it at start"
            )
        positions = batch.get("position_ids")
        seq_len = batch["tokens"].shape[1]
        if positions is not None and (int(positions.min()) < 0 or int(positions.max()) >= seq_len):
            raise DatasetError(
                f"{what}: micro-batch {index} has position ids outside [0, {seq_len}) (corrupt document "
                f"boundaries in a shard); re-run tools/prepare_data.py, which checks and rebuilds damaged shards"
            )
        return batch


class TrainBatchIterator(_Loader):
    """Endless training micro-batches for one DP rank, epoch after epoch, resumable mid-epoch."""

    def __init__(self, dataset: DataParallelStreamingDataset, cfg: DataConfig, micro_batch: int,
                 tokenizer: TokenizerInfo):
        super().__init__(dataset, cfg, micro_batch, tokenizer, "the training data",
                         repeat_span_share=cfg.repeat_span_share)
        self.seed = cfg.seed
        self.epoch = 0
        self._pass_start = 0  # sample_in_epoch where the current pass began (non-zero after resume)
        self._pass_batches = 0  # micro-batches this rank drew in the current pass
        self._pass: Iterator[dict[str, torch.Tensor]] | None = None
        self._started = False

    @property
    def micro_batches_per_epoch(self) -> int:
        """Micro-batches each DP rank draws in one full epoch."""
        return _batches_per_pass(self.epoch_size, 0, self.dp_size, self.micro_batch)

    @property
    def sample_in_epoch(self) -> int:
        """Samples consumed in the current epoch by all DP ranks together."""
        return self._pass_start + self._pass_batches * self.micro_batch * self.dp_size

    def __iter__(self) -> TrainBatchIterator:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        for _ in range(2):  # the current pass may be exhausted: then one new epoch
            if self._pass is None:
                self._pass = iter(self._dataloader)
                self._started = True
            batch = _next_batch(self._pass, f"training epoch {self.epoch}", self._pass_batches)
            if batch is not None:
                self._pass_batches += 1
                return self._checked(batch, f"training epoch {self.epoch}", self._pass_batches - 1)
            expected = _batches_per_pass(self.epoch_size, self._pass_start, self.dp_size, self.micro_batch)
            if self._pass_batches != expected:
                raise _short_pass_error(f"training epoch {self.epoch}", self._pass_batches, expected)
            self.epoch += 1
            self._pass_start = 0
            self._pass_batches = 0
            self._pass = None
        raise RuntimeError("internal error: a fresh training epoch yielded no micro-batch")

    def state_dict(self) -> dict[str, Any]:
        """Where the data stream stands (plain ints/strings; the same on every rank)."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "sample_in_epoch": self.sample_in_epoch,
            "epoch_size": self.epoch_size,
            "seed": self.seed,
            "micro_batch": self.micro_batch,
            "dp_size": self.dp_size,
            "tokenizer": self.tokenizer.name,
            "tokenizer_sha256": self.tokenizer.sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state` (from `state_dict`); call before drawing the first batch."""
        if self._started:
            raise RuntimeError("load_state_dict must be called before the first batch is drawn; build a new loader")
        if state.get("format") != STATE_FORMAT:
            raise DatasetError(f"the checkpoint's data position is not a training data-loader state (format "
                               f"{state.get('format')!r}, expected {STATE_FORMAT!r})")
        saved_sha256 = state.get("tokenizer_sha256")  # absent in checkpoints written before it was recorded
        if saved_sha256 is not None and saved_sha256 != self.tokenizer.sha256:
            raise DatasetError(
                f"the checkpoint was trained on data tokenized with {state.get('tokenizer')!r} (sha256 "
                f"{saved_sha256[:12]}) but data.streams use {self.tokenizer.name!r} (sha256 "
                f"{self.tokenizer.sha256[:12]}): the token ids would mean other text; point data.streams at data "
                f"prepared with the checkpoint's tokenizer"
            )
        if state["epoch_size"] != self.epoch_size:
            raise DatasetError(
                f"the checkpoint's data epoch had {state['epoch_size']} samples, the configured streams give "
                f"{self.epoch_size}: the datasets or mixture changed, so the resume position is meaningless"
            )
        if state["seed"] != self.seed:
            raise DatasetError(
                f"the checkpoint's data seed is {state['seed']} but data.seed is {self.seed}; resuming with "
                f"another seed would change the sample order (set data.seed={state['seed']})"
            )
        if not 0 <= state["sample_in_epoch"] <= self.epoch_size:
            raise DatasetError(f"the checkpoint's data position sample_in_epoch={state['sample_in_epoch']} is "
                               f"outside [0, {self.epoch_size}]")
        self.epoch = int(state["epoch"])
        self._pass_start = int(state["sample_in_epoch"])
        self._pass_batches = 0
        self.dataset.load_state_dict(
            {
                "epoch": self.epoch,
                "sample_in_epoch": self._pass_start,
                "num_canonical_nodes": 1,
                "shuffle_seed": self.seed,
                "initial_physical_nodes": 1,
            }
        )


class ValBatchLoader(_Loader):
    """Validation micro-batches for one DP rank: each `iter()` is one pass, in the same order. `keep_last`
    (one process only: evaluation) ends the pass with the last, partial micro-batch instead of dropping it."""

    def __init__(self, dataset: DataParallelStreamingDataset, cfg: DataConfig, micro_batch: int,
                 tokenizer: TokenizerInfo, keep_last: bool = False):
        super().__init__(dataset, cfg, micro_batch, tokenizer, "the validation data", keep_last)
        self.keep_last = keep_last

    def __len__(self) -> int:
        if self.keep_last:
            return ceil(self.epoch_size / self.micro_batch)
        return _batches_per_pass(self.epoch_size, 0, self.dp_size, self.micro_batch)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        count = 0
        batches = iter(self._dataloader)
        while (batch := _next_batch(batches, "the validation pass", count)) is not None:
            count += 1
            yield self._checked(batch, "the validation pass", count - 1)
        if count != len(self):
            raise _short_pass_error("the validation pass", count, len(self))


def build_train_loader(
    cfg: DataConfig, shape: BatchShape, dp_rank: int, dp_size: int, *, model_vocab_size: int | None = None
) -> TrainBatchIterator:
    """Training micro-batches of `shape` for data-parallel rank `dp_rank` of `dp_size` (collective: all ranks call)."""
    cfg.validate()
    shape.validate()
    shape.num_microbatches(dp_size)  # global_batch must split evenly
    layout = _node_layout(dp_size)
    streams, tokenizer = _open_streams(cfg.streams, cfg, shape.seq_len, model_vocab_size, "train", layout)
    dataset = _make_dataset(streams, cfg, shape.micro_batch, dp_rank, dp_size, layout, train=True)
    return TrainBatchIterator(dataset, cfg, shape.micro_batch, tokenizer)


def build_val_loader(
    cfg: DataConfig, shape: BatchShape, dp_rank: int, dp_size: int, *, model_vocab_size: int | None = None,
    keep_last: bool = False
) -> ValBatchLoader:
    """Validation micro-batches of `shape` (its global batch unused; unshuffled, one pass per iter) for
    `dp_rank` (collective: all ranks call).

    The training streams, if configured, must share the validation streams' tokenizer. `keep_last`: every
    sample, the last micro-batch partial (a single process: DP ranks must see equal batch counts)."""
    cfg.validate()
    shape.validate()
    if keep_last and dp_size != 1:
        raise ValueError(f"keep_last needs one data-parallel rank (every sample in one process), got dp_size={dp_size}")
    if not cfg.val_streams:
        raise DatasetError("data.val_streams is empty: no validation data configured")
    layout = _node_layout(dp_size)
    streams, tokenizer = _open_streams(cfg.val_streams, cfg, shape.seq_len, model_vocab_size, "val", layout,
                                       also_check=cfg.streams)
    dataset = _make_dataset(streams, cfg, shape.micro_batch, dp_rank, dp_size, layout, train=False)
    return ValBatchLoader(dataset, cfg, shape.micro_batch, tokenizer, keep_last)
