"""Tokenize a document stream in worker processes, preserving document order.

Workers are spawned (safe beside threads and torch in the parent) and import only `tokenizers`:
they rebuild the exact Rust tokenizer from its JSON definition, taken from the loaded HF tokenizer.
Special-token strings inside documents (say a literal "<|endoftext|>") are encoded as ordinary
text, so the EOD id only ever appears where the packer puts it: between documents.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterable, Iterator

import numpy as np

_BATCH_CHARS = 1 << 20  # ~1 MB of text per task: amortizes IPC, keeps workers busy
_BATCH_DOCS = 512

# Per-worker-process state: the tokenizer built once by the pool initializer.
_worker_tokenizer = None


def _build_tokenizer(tokenizer_json: str):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.encode_special_tokens = True
    return tokenizer


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker; the workers are the parallelism
    _worker_tokenizer = _build_tokenizer(tokenizer_json)


def _encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
    encodings = tokenizer.encode_batch(texts, add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]


def _encode_in_worker(texts: list[str]) -> list[np.ndarray]:
    return _encode(_worker_tokenizer, texts)


def _batches(documents: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    chars = 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc)
        if chars >= _BATCH_CHARS or len(batch) >= _BATCH_DOCS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def tokenize_documents(
    documents: Iterable[str], tokenizer_json: str, workers: int = 1, progress: object | None = None
) -> Iterator[np.ndarray]:
    """Token ids of each document, in input order (no special tokens added).

    `workers` <= 1 tokenizes in this process (the Rust tokenizer still uses several threads);
    more spawns that many single-threaded worker processes. `progress` (a tqdm bar) is advanced
    by one per document.
    """
    if workers <= 1:
        tokenizer = _build_tokenizer(tokenizer_json)
        results: Iterable[list[np.ndarray]] = (_encode(tokenizer, b) for b in _batches(documents))
        yield from _flatten(results, progress)
        return
    context = mp.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(tokenizer_json,)) as pool:
        yield from _flatten(pool.imap(_encode_in_worker, _batches(documents)), progress)


def _flatten(results: Iterable[list[np.ndarray]], progress: object | None) -> Iterator[np.ndarray]:
    for batch in results:
        yield from batch
        if progress is not None:
            progress.update(len(batch))
