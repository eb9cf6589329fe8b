"""Data: tokenizers, prepared (packed, MDS-sharded) datasets, and streaming batch loaders.

Modules, one concern each:

* `documents` reads text/jsonl/parquet corpora; `tokenizer` trains/loads/describes tokenizers and
  `tokenizer_training` builds one from files; `packing` packs documents into samples; `shards`
  writes and checks MDS shards; `manifest` describes a dataset; `prepare` builds one
  (`parallel_tokenize` runs the tokenizer in worker processes; `atomic_output` makes builds
  all-or-nothing and idempotent); `stdlib_corpus` builds the embedded default corpus.
* `config` (DataConfig, BatchShape), `loader` (build_train_loader / build_val_loader), `batch` (the batch
  contract), `streaming_world` (data-parallel sharding under mosaicml-streaming).

The names below are imported lazily, so worker processes that only tokenize do not import torch
or streaming.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BatchShape": "config",
    "DataConfig": "config",
    "StreamConfig": "config",
    "build_train_loader": "loader",
    "build_val_loader": "loader",
    "TrainBatchIterator": "loader",
    "ValBatchLoader": "loader",
    "collate_packed_samples": "batch",
    "load_tokenizer": "tokenizer",
    "describe_tokenizer": "tokenizer",
    "TokenizerInfo": "tokenizer",
    "read_manifest": "manifest",
    "DatasetManifest": "manifest",
    "DatasetError": "manifest",
    "prepare_dataset": "prepare",
    "build_stdlib_corpus": "stdlib_corpus",
    "load_stdlib_corpus": "stdlib_corpus",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
