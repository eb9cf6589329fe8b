"""The `data` config section: which prepared datasets to stream, how to mix and shuffle them; and the batch shape
the loaders cut them into (`BatchShape`, set by the `train` section: the shape has one home)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cplm_megatron.errors import ConfigError


@dataclass
class StreamConfig:
    """One prepared dataset (a local directory or an s3://... URL) and its weight in the mixture.

    Give at most one of: `proportion` (relative share of the epoch; all streams must then use
    proportions), `repeat` (multiplier on its size) or `choose` (exact samples per epoch).
    None of them: every sample once per epoch.
    """

    path: str = ""
    name: str | None = None
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None

    def validate(self, key: str = "data.streams[]") -> None:
        """Raise ConfigError naming `key` for a bad stream entry."""
        if not self.path:
            raise ConfigError(f"{key}.path is required (a prepared dataset directory or s3://bucket/prefix)")
        weights = [w for w in ("proportion", "repeat", "choose") if getattr(self, w) is not None]
        if len(weights) > 1:
            raise ConfigError(f"{key}: give at most one of proportion/repeat/choose, got {weights}")
        for weight in weights:
            if getattr(self, weight) < 0:
                raise ConfigError(f"{key}.{weight} must be >= 0, got {getattr(self, weight)}")

    @property
    def label(self) -> str:
        """The name used in messages: `name`, else the path."""
        return self.name or self.path


@dataclass(frozen=True)
class BatchShape:
    """Tokens per sample, samples per micro-batch per data-parallel rank, samples per optimizer step: the
    `train.seq_len/micro_batch/global_batch` keys, handed to the loaders (validation: global = micro)."""

    seq_len: int
    micro_batch: int
    global_batch: int

    def validate(self) -> None:
        """Raise ConfigError naming the bad `train.*` key."""
        for name in ("seq_len", "micro_batch", "global_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.global_batch % self.micro_batch:
            raise ConfigError(f"train.global_batch={self.global_batch} is not a multiple of "
                              f"train.micro_batch={self.micro_batch}")

    def num_microbatches(self, dp_size: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank."""
        per_step = self.micro_batch * dp_size
        if dp_size < 1 or self.global_batch % per_step:
            raise ConfigError(
                f"train.global_batch={self.global_batch} must be a multiple of train.micro_batch * data-parallel "
                f"size = {self.micro_batch} * {dp_size} = {per_step}; change train.global_batch or the layout"
            )
        return self.global_batch // per_step


@dataclass
class DataConfig:
    """Which samples training and validation batches are made of (see cplm_megatron.data.loader); their shape is
    a `BatchShape` from the train section."""

    streams: list[StreamConfig] = field(default_factory=list)
    val_streams: list[StreamConfig] = field(default_factory=list)
    seed: int = 1234  # shuffle seed (and seed of stream resampling)
    shuffle: bool = True  # training order; validation is never shuffled
    num_workers: int = 0  # DataLoader worker processes per rank
    document_masking: bool = True  # position/document ids restart at each document start
    eod_mask_loss: bool = False  # no loss on predictions made from an EOD input (Megatron-LM's flag)
    epoch_size: int | None = None  # samples per epoch when mixing by proportion; None: sum of streams
    # Where shards are downloaded and decompressed. None: remote (s3://) streams use $TMPDIR and
    # local datasets are decompressed in place (next to their .zstd shards; needs write access).
    cache_dir: str | None = None
    verify_shards: bool = True  # hash-check local shards at start, once per machine (sizes: always)
    # "spamlang" | "copy" | "copy_random" | "passkey" or a "+" mixture: generated task data (ablations)
    synthetic: str | None = None
    repeat_span_share: float = 0.0  # training samples with a span of their text repeated (data/repeated_spans.py)

    def __post_init__(self) -> None:
        self.streams = [_as_stream(s) for s in self.streams]
        self.val_streams = [_as_stream(s) for s in self.val_streams]

    def validate(self) -> None:
        """Raise ConfigError naming the bad `data.*` key."""
        if self.synthetic is not None:
            from cplm_megatron.data.synthetic import training_tasks

            try:
                training_tasks(self.synthetic)
            except ValueError as err:
                raise ConfigError(f"data.synthetic: {err}, or null") from None
        if self.synthetic is not None and self.repeat_span_share:
            raise ConfigError("data.repeat_span_share changes prepared datasets' samples; data.synthetic tasks have "
                              "their own copy variants (copy, copy_random): set one of them")
        if not 0.0 <= self.repeat_span_share <= 1.0:
            raise ConfigError(f"data.repeat_span_share is a share of training samples in [0, 1], got "
                              f"{self.repeat_span_share}")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.seed < 0:
            raise ConfigError(f"data.seed must be >= 0 (streaming's shuffle seed), got {self.seed}")
        if self.epoch_size is not None and self.epoch_size < 1:
            raise ConfigError(f"data.epoch_size must be >= 1 or null, got {self.epoch_size}")
        for group in ("streams", "val_streams"):
            streams = getattr(self, group)
            for i, stream in enumerate(streams):
                stream.validate(f"data.{group}[{i}]")
            paths = [s.path for s in streams]
            repeated = sorted({p for p in paths if paths.count(p) > 1})
            if repeated:
                raise ConfigError(f"data.{group} lists {repeated} more than once; weight one entry instead")
            with_proportion = [s.proportion is not None for s in streams]
            if any(with_proportion) and not all(with_proportion):
                raise ConfigError(f"data.{group}: give a proportion for every stream or for none")
            absolute = any(s.repeat is not None or s.choose is not None for s in streams)
            if absolute and any(with_proportion):
                raise ConfigError(f"data.{group}: proportions cannot be mixed with repeat/choose")
            if absolute and group == "streams" and self.epoch_size is not None:
                raise ConfigError("data.epoch_size applies to proportions; repeat/choose fix the epoch size already")


def _as_stream(value: Any) -> StreamConfig:
    """Accept StreamConfig objects or plain mappings (from YAML)."""
    if isinstance(value, StreamConfig):
        return value
    if isinstance(value, dict):
        unknown = set(value) - {"path", "name", "proportion", "repeat", "choose"}
        if unknown:
            raise ConfigError(f"data stream entry has unknown keys {sorted(unknown)} "
                              f"(valid: path, name, proportion, repeat, choose)")
        return StreamConfig(**value)
    if isinstance(value, str):
        return StreamConfig(path=value)
    raise ConfigError(f"data stream entry must be a mapping or a path, got {value!r}")
