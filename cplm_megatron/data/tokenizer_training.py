"""Train a BPE tokenizer from corpus files into a directory, atomically and only when inputs changed.

`max_docs` trains on a sample of at most that many documents over the same inputs (files, directories, glob
patterns, @LIST files; see `inputs`): the files of smallest path hash (a deterministic sample spread over the
whole corpus, kept in memory as at most `max_docs` paths), read in hash order until `max_docs` documents."""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import (
    build_atomically,
    file_signatures,
    fingerprint,
    read_marker,
)
from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, DocumentReader, InputError
from cplm_megatron.data.inputs import iter_input_files, sample_files
from cplm_megatron.data.tokenizer import (
    DEFAULT_EOD_TOKEN,
    TRAINING_RECORD,
    TokenizerInfo,
    train_bpe_tokenizer,
)

TRAINER_VERSION = "byte-level-bpe/1"


@dataclass
class TrainedTokenizer:
    """What `train_tokenizer_from_files` produced."""

    output: Path
    info: TokenizerInfo
    rebuilt: bool  # False: the output was already up to date


def train_tokenizer_from_files(
    inputs: Sequence[str | Path],
    vocab_size: int,
    output: str | Path,
    eod_token: str = DEFAULT_EOD_TOKEN,
    split_by: str = "file",
    text_field: str = "text",
    min_frequency: int = 2,
    show_progress: bool = True,
    max_invalid_fraction: float = DEFAULT_MAX_INVALID_FRACTION,
    max_docs: int | None = None,
) -> TrainedTokenizer:
    """Byte-level BPE over the documents of `inputs`, saved as an HF tokenizer directory `output`.

    The vocabulary can come out smaller than `vocab_size` when the text has too few distinct pairs
    (the actual size is in the returned info)."""
    if max_docs is not None and max_docs < 1:
        raise InputError(f"--max-docs must be >= 1, got {max_docs}")
    listing = None
    if max_docs is None:
        files = list(iter_input_files(inputs))
    else:
        files, listing = sample_files(inputs, max_docs)
    settings = {
        "trainer": TRAINER_VERSION,
        "vocab_size": vocab_size,
        "eod_token": eod_token,
        "split_by": split_by,
        "text_field": text_field,
        "min_frequency": min_frequency,
    }
    if max_docs is not None:  # (absent otherwise: tokenizers trained on everything keep their fingerprint)
        settings.update(max_docs=max_docs, listing=listing)
    build_fingerprint = fingerprint({"inputs": file_signatures(files), **settings})

    output = Path(output).resolve()

    def build(tmp_dir: Path) -> None:
        reader = DocumentReader(files, split_by=split_by, text_field=text_field,
                                max_invalid_fraction=max_invalid_fraction)
        record = {"fingerprint": build_fingerprint, "settings": settings, "source_files": [str(f) for f in files]}
        documents = _non_empty(reader)
        if max_docs is not None:
            documents = _counted(itertools.islice(documents, max_docs), record)
        train_bpe_tokenizer(
            documents, vocab_size, tmp_dir, eod_token=eod_token, min_frequency=min_frequency,
            show_progress=show_progress, record=record, name=output.name,
        )

    rebuilt = build_atomically(output, TRAINING_RECORD, build_fingerprint, build)
    info = TokenizerInfo(**read_marker(output, TRAINING_RECORD)["tokenizer"])  # no transformers import needed
    return TrainedTokenizer(output=output, info=info, rebuilt=rebuilt)


def _non_empty(reader: DocumentReader) -> Iterator[str]:
    """Yield the reader's documents; raise InputError at the end if there were none."""
    yield from reader
    if reader.stats.documents == 0:
        raise InputError(f"no text to train on: all {reader.stats.files} input files were empty")


def _counted(documents: Iterator[str], record: dict) -> Iterator[str]:
    """Pass documents through; record["documents"] ends up as their number (written after training)."""
    record["documents"] = 0
    for doc in documents:
        record["documents"] += 1
        yield doc
