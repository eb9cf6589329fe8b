"""Prepare a training dataset: read documents, tokenize them, pack them, write MDS shards + manifest.

The output directory appears only when complete (see `atomic_output`); a rerun with the same
inputs (paths, sizes, modification times), tokenizer and settings is a no-op once its shards check
out against index.json (sizes and hashes); damaged shards or anything else changed rebuilds. The
output is identical for any number of workers.

`part=(I, N)` builds part I of N instead (see `inputs`: a deterministic 1/N of the input files, by file)
into ``OUTPUT/part-0000I-of-0000N/`` with its own manifest; `parts.merge_parts` joins the N parts into one
dataset at OUTPUT. A part may be empty (no file of the inputs hashed to it). Progress goes to stderr: a
tqdm bar on a terminal, else (a SLURM job log) one line every `progress_interval` seconds.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import (
    build_atomically,
    file_signatures,
    fingerprint,
)
from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, DocumentReader, InputError
from cplm_megatron.data.importers import TextFiles, plan_sources
from cplm_megatron.data.inputs import iter_input_files, list_part, part_dir_name
from cplm_megatron.data.manifest import (
    FORMAT,
    MANIFEST_NAME,
    DatasetManifest,
    read_manifest,
    write_manifest,
)
from cplm_megatron.data.packing import SamplePacker
from cplm_megatron.data.parallel_tokenize import tokenize_documents
from cplm_megatron.data.shards import (
    DEFAULT_SHARD_SIZE_LIMIT,
    INDEX_NAME,
    make_manifest,
    verify_local_shards,
    write_packed_samples,
)
from cplm_megatron.data.tokenizer import (
    backend_json,
    describe_tokenizer,
    load_tokenizer,
    tokenizer_sha256,
)

PathLike = str | Path
DEFAULT_PROGRESS_INTERVAL = 30.0  # seconds between progress lines when stderr is not a terminal


class LineProgress:
    """tqdm's `update`/`set_postfix` as one plain line every `interval` seconds (job logs have no terminal)."""

    def __init__(self, label: str, interval: float):
        self.label = label
        self.interval = interval
        self.documents = 0
        self.tokens = 0
        self.start = time.monotonic()
        self._last = self.start

    def line(self, what: str = "") -> None:
        elapsed = time.monotonic() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        print(f"[prepare_data] {self.label}: {what or 'progress'}: {self.documents:,} documents, "
              f"{self.tokens:,} tokens, {elapsed:.0f} s ({rate:,.0f} tokens/s)", file=sys.stderr, flush=True)

    def update(self, n: int = 1) -> None:
        self.documents += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.line()

    def set_postfix(self, **_: object) -> None:
        pass

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@dataclass
class PrepareResult:
    """What `prepare_dataset` produced."""

    output: Path
    manifest: DatasetManifest
    rebuilt: bool  # False: the output was already up to date
    damage: str | None = None  # why an up-to-date output was rebuilt (damaged shards)

    def summary(self, part: tuple[int, int] | None = None) -> dict[str, object]:
        """What tools/prepare_data.py prints (JSON): status, output, the manifest's counts; a part's number."""
        manifest = self.manifest
        out: dict[str, object] = {
            "status": ("repaired" if self.damage else "written") if self.rebuilt else "up to date",
            "output": str(self.output), "documents": manifest.documents, "tokens": manifest.tokens,
            "samples": manifest.samples, "seq_len": manifest.seq_len, "tokenizer": manifest.tokenizer.name,
        }
        if part is not None:
            out.update(part=f"{part[0]}/{part[1]}", files=len(manifest.source_files))
        return out


MAX_SHARD_BYTES = 2**32  # mosaicml-streaming's bound on a shard's size (its offsets are 32-bit)


def check_settings(seq_len: int, workers: int, shard_size_limit: str | int) -> None:
    """The numeric settings of a preparation, before any input is read (InputError naming the flag: --seq-len 0 and
    --shard-size abc were tracebacks from the packer and the shard writer, --workers -2 ran as 1)."""
    from cplm_megatron.data._streaming_import import bytes_to_int

    if seq_len < 1:
        raise InputError(f"--seq-len must be >= 1, got {seq_len}")
    if workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}")
    try:
        size = bytes_to_int(shard_size_limit)
    except ValueError:
        size = None
    if size is None or not 1 <= size < MAX_SHARD_BYTES:
        raise InputError(f"--shard-size must be a size from 1b to under 4gb (e.g. 64mb), got {shard_size_limit!r}")


def prepare_dataset(
    inputs: Sequence[PathLike],
    tokenizer_dir: PathLike,
    output: PathLike,
    seq_len: int,
    workers: int = 1,
    split_by: str = "file",
    text_field: str = "text",
    shard_size_limit: str | int = DEFAULT_SHARD_SIZE_LIMIT,
    show_progress: bool = True,
    max_invalid_fraction: float = DEFAULT_MAX_INVALID_FRACTION,
    part: tuple[int, int] | None = None,
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
) -> PrepareResult:
    """Tokenize `inputs` with the tokenizer in `tokenizer_dir` into a packed dataset at `output`
    (with `part=(I, N)`: part I of N of the inputs, into its sub-directory of `output`).

    `inputs`: files, directories, glob patterns, @LIST files (see `inputs`), `datasets` save_to_disk folders and
    Megatron indexed datasets (see `importers`: their ids are re-packed under this tokenizer).
    `max_invalid_fraction`: a file with a larger share of invalid-UTF-8/NUL bytes is refused (InputError)."""
    check_settings(seq_len, workers, shard_size_limit)
    label, listing = Path(output).name, None
    sources = plan_sources([str(i) for i in inputs], split_by, text_field, max_invalid_fraction)
    if part is not None:
        if sources is not None:
            raise InputError("--part splits text files between jobs; a datasets folder or a Megatron dataset is "
                             "prepared in one job: drop --part")
        index, count = part
        files, listing = list_part(inputs, index, count)
        output = Path(output) / part_dir_name(index, count)
        label = f"part {index}/{count}"
    elif sources is None:
        files = list(iter_input_files(inputs))
    if sources is None:
        sources = [TextFiles(files, DocumentReader(files, split_by, text_field, max_invalid_fraction))]
    files = [f for source in sources for f in source.files]
    build_settings = {
        "format": FORMAT,
        "tokenizer_sha256": tokenizer_sha256(tokenizer_dir),
        "seq_len": seq_len,
        "split_by": split_by,
        "text_field": text_field,
        "shard_size_limit": shard_size_limit,
    }
    build_fingerprint = fingerprint({**build_settings, "inputs": file_signatures(files),
                                     **({"part": list(part)} if part else {})})

    def build(tmp_dir: Path) -> None:
        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer_info = describe_tokenizer(tokenizer_dir, tokenizer)
        with _progress_bar(label, show_progress, progress_interval, len(files), output) as bar:
            token_docs = _token_documents(sources, backend_json(tokenizer, tokenizer_dir), tokenizer_info, workers,
                                          bar)
            packer = _pack(_counting_tokens(token_docs, bar), tmp_dir, seq_len, tokenizer_info, shard_size_limit,
                           part is not None)
            bar.set_postfix(tokens=packer.tokens, samples=packer.samples)
            if isinstance(bar, LineProgress):
                bar.line(f"done, {packer.samples:,} samples")
        settings = {
            "split_by": split_by,
            "text_field": text_field,
            "shard_size_limit": shard_size_limit,
            "empty_documents_skipped": sum(source.stats.empty_skipped for source in sources),
            "documents_with_invalid_utf8": sum(source.stats.decode_errors for source in sources),
        }
        if any(not isinstance(source, TextFiles) for source in sources):
            settings["sources"] = [source.describe() for source in sources]
        if part is not None:
            settings["part"] = {"index": part[0], "count": part[1], "inputs": _input_spec(inputs),
                                "listing": listing, "build": fingerprint(build_settings)}
        manifest = make_manifest(packer, tokenizer_info, build_fingerprint, [str(f) for f in files], settings)
        write_manifest(tmp_dir, manifest)

    output = Path(output).resolve()
    damage: list[str] = []
    rebuilt = build_atomically(output, MANIFEST_NAME, build_fingerprint, build,
                               check=lambda out: verify_local_shards(out, check_hashes=True), on_damage=damage.append)
    manifest = read_manifest(str(output))
    if part is not None and manifest.settings.get("part", {}).get("listing") != listing:
        # An intact part whose own files did not change, in a listing that did (files added to other parts):
        # its shards stand, its record of the listing is brought up to date for the merge's check.
        manifest.settings["part"]["listing"] = listing
        tmp = output / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, output / MANIFEST_NAME)
    return PrepareResult(output=output, manifest=manifest, rebuilt=rebuilt, damage=damage[0] if damage else None)


def _progress_bar(label: str, show: bool, interval: float, files: int, output: PathLike):
    """A tqdm bar of documents on a terminal; one line every `interval` seconds in a job log (LineProgress)."""
    from tqdm import tqdm

    if show and not sys.stderr.isatty():
        print(f"[prepare_data] {label}: {files:,} input files -> {output}", file=sys.stderr, flush=True)
        return LineProgress(label, interval)
    return tqdm(desc=f"tokenize -> {label}", unit="doc", disable=not show, file=sys.stderr)


def _token_documents(sources: list, tokenizer_json: str, tokenizer_info, workers: int, bar) -> Iterator:
    """Every source's documents as token ids, in order: text tokenized (by `workers` processes), a Megatron
    dataset's ids as they are (checked against the tokenizer's vocabulary)."""
    for source in sources:
        if source.kind == "ids":
            for ids in source.token_documents(tokenizer_info.vocab_size, tokenizer_info.eod_id):
                bar.update(1)
                yield ids
        else:
            yield from tokenize_documents(source.documents(), tokenizer_json, workers=workers, progress=bar)


def _pack(token_docs: Iterator, tmp_dir: Path, seq_len: int, tokenizer_info, shard_size_limit: str | int,
          is_part: bool) -> SamplePacker:
    """Pack and write the shards; a part that no document fell into gets an empty index."""
    if is_part:
        first = next(token_docs, None)
        if first is None:  # no file (or only empty ones) hashed to this part
            return _write_empty_part(tmp_dir, seq_len, tokenizer_info)
        token_docs = itertools.chain([first], token_docs)
    return write_packed_samples(token_docs, tmp_dir, seq_len, tokenizer_info, shard_size_limit)


def _counting_tokens(token_docs: Iterable, bar: object) -> Iterator:
    """Pass documents through, adding their token counts (plus EOD) to a LineProgress."""
    for doc in token_docs:
        if isinstance(bar, LineProgress):
            bar.tokens += len(doc) + 1
        yield doc


def _input_spec(inputs: Sequence[PathLike]) -> list[str]:
    """The inputs as given, made absolute: parts of one dataset must all have been given the same."""
    spec = []
    for raw in map(str, inputs):
        prefix, rest = ("@", raw[1:]) if raw.startswith("@") else ("", raw)
        spec.append(prefix + os.path.abspath(os.path.expanduser(rest)))
    return spec


def _write_empty_part(directory: Path, seq_len: int, tokenizer_info) -> SamplePacker:
    """An index with no shards: a part that no document fell into."""
    (Path(directory) / INDEX_NAME).write_text(json.dumps({"version": 2, "shards": []}) + "\n")
    return SamplePacker(seq_len, tokenizer_info.eod_id, tokenizer_info.vocab_size)
