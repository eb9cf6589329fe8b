"""Inputs the data tools read besides text files: a Hugging Face `datasets` folder written by `save_to_disk`, and a
Megatron indexed dataset (`PREFIX.bin` + `PREFIX.idx`, what Megatron-LM's tools/preprocess_data.py writes).

* A `save_to_disk` folder (`state.json`, `dataset_info.json`, `data-*.arrow`) is read with pyarrow in the order
  its state.json lists the Arrow stream files: one document per row, from `text_field`. A DatasetDict folder
  (`dataset_dict.json`) is refused with its splits named: pass one split's folder.
* A Megatron indexed dataset holds token ids under someone's tokenizer. They are re-packed as they are, never
  decoded and re-encoded (exact, and no decode/encode round trip to go wrong): the tokenizer named with
  --tokenizer must be the one they were made with. Every id is checked against its vocabulary, and documents are
  split at its end-of-document id (preprocess_data.py --append-eod ends each document with it; the packer adds
  its own). The .idx layout is megatron-core's (megatron/core/datasets/indexed_dataset.py): the 9-byte magic
  `MMIDIDX\\x00\\x00`, version (<Q, 1), dtype code (<B), sequence count (<Q), document count (<Q), then
  sequence_lengths int32[n], sequence_pointers int64[n] (byte offsets into .bin), document_indices int64[d]
  (sequence indices where documents begin; the first 0, the last n); multimodal ones append int8[n] modes.

`plan_sources` turns the data tools' `--input` list into sources: these two kinds, and text files for the rest.
"""
from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, DocumentReader, InputError, ReadStats
from cplm_megatron.data.inputs import iter_input_files

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_HEADER_BYTES = 9 + 8 + 1 + 8 + 8
# megatron-core's DType codes (indexed_dataset.py)
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                   8: np.uint16}
HF_STATE, HF_INFO, HF_DICT = "state.json", "dataset_info.json", "dataset_dict.json"
_ROWS_PER_BATCH = 1024


@dataclass
class TextFiles:
    """Plain text, JSON lines and Parquet files (documents.DocumentReader)."""

    files: list[Path]
    reader: DocumentReader
    kind: str = "text"

    def documents(self) -> Iterator[str]:
        return iter(self.reader)

    @property
    def stats(self) -> ReadStats:
        return self.reader.stats

    def describe(self) -> dict:
        return {"kind": "files", "files": len(self.files)}


@dataclass
class SavedHFDataset:
    """A `datasets.Dataset.save_to_disk` folder: one document per row of `text_field`."""

    path: Path
    text_field: str
    arrow_files: list[Path]
    stats: ReadStats = field(default_factory=ReadStats)
    kind: str = "text"

    @property
    def files(self) -> list[Path]:
        return [self.path / HF_STATE, self.path / HF_INFO, *self.arrow_files]

    def describe(self) -> dict:
        return {"kind": "hf_saved_dataset", "path": str(self.path), "text_field": self.text_field,
                "arrow_files": len(self.arrow_files)}

    def documents(self) -> Iterator[str]:
        import pyarrow as pa

        for path in self.arrow_files:
            try:
                with pa.memory_map(str(path)) as source:
                    reader = pa.ipc.open_stream(source)
                    if self.text_field not in reader.schema.names:
                        raise InputError(f"{self.path}: no column {self.text_field!r} (columns: {reader.schema.names}); "
                                         f"choose the column with --text-field")
                    for batch in reader:
                        yield from self._texts(path, batch.column(self.text_field).to_pylist())
            except (pa.ArrowInvalid, OSError) as err:
                raise InputError(f"cannot read {path} (an Arrow stream of a datasets save_to_disk folder): {err}; "
                                 f"save the dataset again") from None
            self.stats.files += 1

    def _texts(self, path: Path, values: list) -> Iterator[str]:
        for value in values:
            if value is not None and not isinstance(value, str):
                raise InputError(f"{path}: column {self.text_field!r} holds {type(value).__name__} values, not text; "
                                 f"choose the text column with --text-field")
            if value and value.strip():
                self.stats.documents += 1
                yield value
            else:
                self.stats.empty_skipped += 1


@dataclass
class MegatronIndexed:
    """A Megatron indexed dataset: token ids per document, re-packed as they are."""

    prefix: Path
    dtype: np.dtype
    sequence_lengths: np.ndarray
    sequence_pointers: np.ndarray
    document_indices: np.ndarray
    stats: ReadStats = field(default_factory=ReadStats)
    kind: str = "ids"

    @property
    def files(self) -> list[Path]:
        return [self.prefix.with_name(self.prefix.name + ".idx"), self.prefix.with_name(self.prefix.name + ".bin")]

    def describe(self) -> dict:
        return {"kind": "megatron_indexed", "prefix": str(self.prefix), "dtype": np.dtype(self.dtype).name,
                "sequences": int(len(self.sequence_lengths)), "documents": int(len(self.document_indices) - 1)}

    def token_documents(self, vocab_size: int, eod_id: int) -> Iterator[np.ndarray]:
        """Each document's ids (split at `eod_id`, which the packer adds back), checked against `vocab_size`."""
        tokens = np.memmap(self.files[1], dtype=self.dtype, mode="r")
        itemsize = np.dtype(self.dtype).itemsize
        for start, end in zip(self.document_indices[:-1], self.document_indices[1:]):
            if end <= start:
                continue
            first = int(self.sequence_pointers[start]) // itemsize
            last = int(self.sequence_pointers[end - 1]) // itemsize + int(self.sequence_lengths[end - 1])
            ids = np.asarray(tokens[first:last])
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
                raise InputError(f"{self.files[1]}: token id {bad} is outside the --tokenizer's vocabulary "
                                 f"({vocab_size} tokens): the ids were made with another tokenizer; pass that one")
            for piece in np.split(ids, np.flatnonzero(ids == eod_id) + 1):
                piece = piece[:-1] if len(piece) and piece[-1] == eod_id else piece
                if len(piece):
                    self.stats.documents += 1
                    yield piece.astype(np.uint32)
        self.stats.files = 1


def _megatron_prefix(raw: str) -> Path | None:
    """The prefix of a Megatron indexed dataset named as PREFIX, PREFIX.bin or PREFIX.idx (both files present)."""
    path = Path(raw).expanduser()
    prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
    idx, bin_ = prefix.with_name(prefix.name + ".idx"), prefix.with_name(prefix.name + ".bin")
    if path.suffix in (".bin", ".idx") or (idx.is_file() or bin_.is_file()) and not path.exists():
        missing = [p for p in (idx, bin_) if not p.is_file()]
        if missing:
            raise InputError(f"{raw}: a Megatron indexed dataset needs {idx.name} and {bin_.name} side by side; "
                             f"{missing[0]} does not exist")
        return prefix.resolve()
    return None


def read_megatron_index(prefix: Path) -> MegatronIndexed:
    """Parse PREFIX.idx (megatron-core's layout, see the module doc) and check it against PREFIX.bin's size."""
    idx = prefix.with_name(prefix.name + ".idx")
    data = idx.read_bytes()
    if data[:9] != MEGATRON_MAGIC or len(data) < MEGATRON_HEADER_BYTES:
        raise InputError(f"{idx} is not a Megatron index file (its header is not {MEGATRON_MAGIC!r})")
    version, code, n, d = struct.unpack_from("<QBQQ", data, 9)
    if version != 1 or code not in MEGATRON_DTYPES or MEGATRON_DTYPES[code] in (np.float32, np.float64):
        raise InputError(f"{idx}: version {version}, dtype code {code}: not a token-id dataset this tool reads "
                         f"(version 1 with integer ids)")
    arrays = MEGATRON_HEADER_BYTES + 4 * n + 8 * n + 8 * d
    if len(data) == arrays + n:
        raise InputError(f"{idx} is a multimodal Megatron dataset (per-sequence modes): not text; leave it out")
    if len(data) != arrays:
        raise InputError(f"{idx} is {len(data):,} bytes where {n:,} sequences and {d:,} document indices take "
                         f"{arrays:,}: truncated or damaged; write it again")
    lengths = np.frombuffer(data, np.int32, n, MEGATRON_HEADER_BYTES)
    pointers = np.frombuffer(data, np.int64, n, MEGATRON_HEADER_BYTES + 4 * n)
    documents = np.frombuffer(data, np.int64, d, MEGATRON_HEADER_BYTES + 12 * n)
    dtype = np.dtype(MEGATRON_DTYPES[code])
    bin_ = prefix.with_name(prefix.name + ".bin")
    expected = int(lengths.astype(np.int64).sum()) * dtype.itemsize
    if bin_.stat().st_size != expected or (d and (documents[0] != 0 or documents[-1] != n)):
        raise InputError(f"{bin_} is {bin_.stat().st_size:,} bytes where its index describes {expected:,}: the pair "
                         f"does not match (truncated, or files of two datasets); write it again")
    return MegatronIndexed(prefix, dtype, lengths, pointers, documents)


def _saved_hf_dataset(raw: str, text_field: str) -> SavedHFDataset | None:
    """A save_to_disk folder named by `raw` (None when it is not one)."""
    path = Path(raw).expanduser()
    if not path.is_dir():
        return None
    if (path / HF_DICT).is_file():
        splits = json.loads((path / HF_DICT).read_text()).get("splits", [])
        raise InputError(f"{raw} is a datasets DatasetDict with splits {', '.join(splits)}: pass one split's folder, "
                         f"e.g. {path / (splits[0] if splits else 'train')}")
    if not ((path / HF_STATE).is_file() and (path / HF_INFO).is_file()):
        return None
    try:
        names = [entry["filename"] for entry in json.loads((path / HF_STATE).read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"{path / HF_STATE} does not list the dataset's Arrow files ({err}); save it again") from None
    missing = [name for name in names if not (path / name).is_file()]
    if missing:
        raise InputError(f"{path / missing[0]} (listed in {HF_STATE}) does not exist; copy or save the dataset again")
    return SavedHFDataset(path.resolve(), text_field, [(path / name).resolve() for name in names])


def plan_sources(inputs: Sequence[str], split_by: str = "file", text_field: str = "text",
                 max_invalid_fraction: float = DEFAULT_MAX_INVALID_FRACTION) -> list | None:
    """The inputs as sources in the given order, when at least one is a saved HF dataset or a Megatron dataset
    (each other input: its text files); None when all are text inputs (the tools' usual path)."""
    special = []
    for raw in map(str, inputs):
        if raw.startswith("@"):
            special.append(None)
            continue
        prefix = _megatron_prefix(raw)
        special.append(read_megatron_index(prefix) if prefix else _saved_hf_dataset(raw, text_field))
    if not any(special):
        return None
    sources: list = []
    for raw, source in zip(map(str, inputs), special):
        if source is None:
            files = list(iter_input_files([raw]))
            source = TextFiles(files, DocumentReader(files, split_by, text_field, max_invalid_fraction))
        sources.append(source)
    return sources
