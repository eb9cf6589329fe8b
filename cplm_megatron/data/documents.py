"""Read text documents from local files and directories, in a deterministic order.

Supported inputs (optionally compressed with ``.gz`` or ``.zst``):

* plain text (``.txt .text .md .rst .py``): a whole file is one document (``split_by="file"``),
  or one per non-empty line (``"line"``), or one per blank-line separated paragraph (``"paragraph"``);
* JSON lines (``.jsonl .ndjson``): one document per record, taken from its ``text_field``;
* Parquet (``.parquet``): one document per row of the ``text_field`` column (needs pyarrow).

Directories are searched recursively for these suffixes and visited in sorted path order, so
the same inputs always give the same document sequence. Empty documents are skipped. A file whose
bytes are mostly not text (invalid UTF-8 or NUL: binary data, UTF-16, Latin-1) is refused unless
`max_invalid_fraction` allows it; the few bad bytes of an accepted file are replaced (and counted).
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.errors import UserError

PLAIN_TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSION_SUFFIXES = (".gz", ".zst")
SPLIT_MODES = ("file", "line", "paragraph")

DEFAULT_MAX_INVALID_FRACTION = 0.1  # binary files measure 0.25-0.55, UTF-8 text 0


def add_reading_arguments(parser: argparse.ArgumentParser) -> None:
    """--split-by, --text-field, --max-invalid-utf8: how the data tools (prepare_data, train_tokenizer) read
    documents out of their input files."""
    parser.add_argument("--split-by", choices=SPLIT_MODES, default="file",
                        help="documents of plain-text files: whole file, each line, or blank-line paragraphs")
    parser.add_argument("--text-field", default="text", help="JSON field / parquet column holding the text")
    parser.add_argument("--max-invalid-utf8", type=float, default=DEFAULT_MAX_INVALID_FRACTION, metavar="FRACTION",
                        help="refuse an input file whose share of invalid-UTF-8/NUL bytes is larger (binary data, "
                             "another encoding); 1 accepts anything (bad bytes are replaced). Default: %(default)s")

PathLike = str | Path
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t]*\n)+")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # an undecodable byte after errors="surrogateescape"


class InputError(UserError):
    """Bad or unreadable corpus input; the message names the file and the fix."""


def _kind_of(path: Path) -> str | None:
    """'text' | 'jsonl' | 'parquet' for a supported file name, else None."""
    name = path.name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            if name.endswith(PARQUET_SUFFIXES):
                return None  # parquet compresses internally
            break
    if name.endswith(PLAIN_TEXT_SUFFIXES):
        return "text"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def supported_suffixes() -> list[str]:
    """Every file suffix `expand_inputs` accepts, for error messages and --help."""
    base = PLAIN_TEXT_SUFFIXES + JSONL_SUFFIXES
    return list(base + PARQUET_SUFFIXES) + [s + c for s in base for c in COMPRESSION_SUFFIXES]


def expand_inputs(inputs: Sequence[PathLike]) -> list[Path]:
    """Files named by `inputs` (files kept in the given order, directories expanded sorted)."""
    if not inputs:
        raise InputError("no input paths given; pass files or directories of text")
    files: list[Path] = []
    seen = set()
    for raw in inputs:
        path = Path(raw).expanduser().resolve()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _kind_of(p))
            if not found:
                raise InputError(
                    f"input directory {path} holds no supported files (looked for "
                    f"{', '.join(supported_suffixes())})"
                )
        elif path.is_file():
            if _kind_of(path) is None:
                raise InputError(
                    f"unsupported input file {path}: supported suffixes are "
                    f"{', '.join(supported_suffixes())}"
                )
            found = [path]
        else:
            raise InputError(f"input path does not exist: {raw}")
        for p in found:
            if p not in seen:
                seen.add(p)
                files.append(p)
    return files


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed by suffix."""
    import zstd

    name = path.name.lower()
    try:
        if name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        if name.endswith(".zst"):
            return zstd.decompress(path.read_bytes())
        return path.read_bytes()
    except (OSError, EOFError, zstd.Error) as e:  # gzip raises BadGzipFile (an OSError) or EOFError
        raise InputError(f"cannot read {path}: {type(e).__name__}: {e} (corrupt or truncated?)") from e


@dataclass
class ReadStats:
    """What a `DocumentReader` has read so far."""

    files: int = 0
    documents: int = 0
    empty_skipped: int = 0
    decode_errors: int = 0  # files (or records) whose bytes were not valid UTF-8 (bad bytes replaced)


class DocumentReader:
    """Iterates the documents of a list of files; `stats` counts what was read."""

    def __init__(self, files: Sequence[Path], split_by: str = "file", text_field: str = "text",
                 max_invalid_fraction: float = DEFAULT_MAX_INVALID_FRACTION):
        if split_by not in SPLIT_MODES:
            raise InputError(f"split_by={split_by!r} is not one of {list(SPLIT_MODES)}")
        if not 0.0 <= max_invalid_fraction <= 1.0:
            raise InputError(f"max_invalid_fraction must be in [0, 1], got {max_invalid_fraction}")
        self.files = list(files)
        self.split_by = split_by
        self.text_field = text_field
        self.max_invalid_fraction = max_invalid_fraction
        self.stats = ReadStats()

    def __iter__(self) -> Iterator[str]:
        for path in self.files:
            kind = _kind_of(path)
            if kind == "parquet":
                pieces = self._parquet_texts(path)
            else:
                data = _read_bytes(path)
                self._check_is_text(path, data)
                pieces = self._jsonl_texts(path, data) if kind == "jsonl" else self._text_pieces(data)
            for text in pieces:
                if text.strip():
                    self.stats.documents += 1
                    yield text
                else:
                    self.stats.empty_skipped += 1
            self.stats.files += 1

    def _check_is_text(self, path: Path, data: bytes) -> None:
        """Refuse a file whose share of invalid-UTF-8 and NUL bytes exceeds `max_invalid_fraction`."""
        if not data:
            return
        escaped = data.decode("utf-8", errors="surrogateescape")
        bad = len(escaped) - len(_ESCAPED_BYTE.sub("", escaped)) + data.count(b"\x00")
        if bad / len(data) > self.max_invalid_fraction:
            raise InputError(
                f"{path}: {bad / len(data):.0%} of its {len(data):,} bytes are not text (invalid UTF-8 or NUL): "
                f"binary data, or text in another encoding (UTF-16, Latin-1)? Convert it to UTF-8 or leave it "
                f"out; --max-invalid-utf8 {min(1.0, round(bad / len(data) + 0.005, 2))} accepts it (bad bytes "
                f"are replaced)"
            )

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.stats.decode_errors += 1
            return data.decode("utf-8", errors="replace")

    def _text_pieces(self, data: bytes) -> Iterator[str]:
        text = self._decode(data)
        if self.split_by == "file":
            yield text
        elif self.split_by == "line":
            yield from text.splitlines()
        else:
            yield from _PARAGRAPH_BREAK.split(text)

    def _jsonl_texts(self, path: Path, data: bytes) -> Iterator[str]:
        for lineno, line in enumerate(io.BytesIO(data), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: invalid JSON ({e.msg})") from e
            except UnicodeDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start}); "
                                 f"convert the file to UTF-8") from e
            if not isinstance(record, dict) or self.text_field not in record:
                raise InputError(
                    f"{path}:{lineno}: record has no {self.text_field!r} field "
                    f"(choose the field with --text-field)"
                )
            value = record[self.text_field]
            if not isinstance(value, str):
                raise InputError(
                    f"{path}:{lineno}: field {self.text_field!r} is {type(value).__name__}, not a string"
                )
            yield value

    def _parquet_texts(self, path: Path) -> Iterator[str]:
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise InputError(f"reading {path} needs pyarrow: pip install pyarrow") from e
        try:
            parquet = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid and friends
            raise InputError(f"cannot read parquet file {path}: {e}") from e
        if self.text_field not in parquet.schema_arrow.names:
            raise InputError(
                f"{path}: no column {self.text_field!r} (columns: {parquet.schema_arrow.names}); "
                f"choose the column with --text-field"
            )
        for batch in parquet.iter_batches(columns=[self.text_field], batch_size=1024):
            for value in batch.column(0).to_pylist():
                yield value if isinstance(value, str) else ""
