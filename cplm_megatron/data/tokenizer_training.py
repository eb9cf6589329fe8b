"""Train a BPE tokenizer from corpus files into a directory, atomically and only when inputs changed."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import (
    build_atomically,
    file_signatures,
    fingerprint,
    read_marker,
)
from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, DocumentReader, InputError, expand_inputs
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
) -> TrainedTokenizer:
    """Byte-level BPE over the documents of `inputs`, saved as an HF tokenizer directory `output`.

    The vocabulary can come out smaller than `vocab_size` when the text has too few distinct pairs
    (the actual size is in the returned info)."""
    files = expand_inputs(inputs)
    settings = {
        "trainer": TRAINER_VERSION,
        "vocab_size": vocab_size,
        "eod_token": eod_token,
        "split_by": split_by,
        "text_field": text_field,
        "min_frequency": min_frequency,
    }
    build_fingerprint = fingerprint({"inputs": file_signatures(files), **settings})

    output = Path(output).resolve()

    def build(tmp_dir: Path) -> None:
        reader = DocumentReader(files, split_by=split_by, text_field=text_field,
                                max_invalid_fraction=max_invalid_fraction)
        record = {"fingerprint": build_fingerprint, "settings": settings, "source_files": [str(f) for f in files]}
        train_bpe_tokenizer(
            _non_empty(reader), vocab_size, tmp_dir, eod_token=eod_token, min_frequency=min_frequency,
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
