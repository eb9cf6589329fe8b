"""Prepare a training dataset: read documents, tokenize them, pack them, write MDS shards + manifest.

The output directory appears only when complete (see `atomic_output`); a rerun with the same
inputs (paths, sizes, modification times), tokenizer and settings is a no-op once its shards check
out against index.json (sizes and hashes); damaged shards or anything else changed rebuilds. The
output is identical for any number of workers.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import (
    build_atomically,
    file_signatures,
    fingerprint,
)
from cplm_megatron.data.documents import DEFAULT_MAX_INVALID_FRACTION, DocumentReader, expand_inputs
from cplm_megatron.data.manifest import (
    FORMAT,
    MANIFEST_NAME,
    DatasetManifest,
    read_manifest,
    write_manifest,
)
from cplm_megatron.data.parallel_tokenize import tokenize_documents
from cplm_megatron.data.shards import (
    DEFAULT_SHARD_SIZE_LIMIT,
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


@dataclass
class PrepareResult:
    """What `prepare_dataset` produced."""

    output: Path
    manifest: DatasetManifest
    rebuilt: bool  # False: the output was already up to date
    damage: str | None = None  # why an up-to-date output was rebuilt (damaged shards)


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
) -> PrepareResult:
    """Tokenize `inputs` with the tokenizer in `tokenizer_dir` into a packed dataset at `output`.

    `max_invalid_fraction`: a file with a larger share of invalid-UTF-8/NUL bytes is refused (InputError)."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    files = expand_inputs(inputs)
    build_fingerprint = fingerprint(
        {
            "format": FORMAT,
            "inputs": file_signatures(files),
            "tokenizer_sha256": tokenizer_sha256(tokenizer_dir),
            "seq_len": seq_len,
            "split_by": split_by,
            "text_field": text_field,
            "shard_size_limit": shard_size_limit,
        }
    )

    def build(tmp_dir: Path) -> None:
        from tqdm import tqdm

        reader = DocumentReader(files, split_by=split_by, text_field=text_field,
                                max_invalid_fraction=max_invalid_fraction)
        tokenizer = load_tokenizer(tokenizer_dir)
        tokenizer_info = describe_tokenizer(tokenizer_dir, tokenizer)
        tokenizer_json = backend_json(tokenizer, tokenizer_dir)
        with tqdm(desc=f"tokenize -> {Path(output).name}", unit="doc", disable=not show_progress,
                  file=sys.stderr) as bar:
            token_docs = tokenize_documents(reader, tokenizer_json, workers=workers, progress=bar)
            packer = write_packed_samples(token_docs, tmp_dir, seq_len, tokenizer_info, shard_size_limit)
            bar.set_postfix(tokens=packer.tokens, samples=packer.samples)
        settings = {
            "split_by": split_by,
            "text_field": text_field,
            "shard_size_limit": shard_size_limit,
            "empty_documents_skipped": reader.stats.empty_skipped,
            "documents_with_invalid_utf8": reader.stats.decode_errors,
        }
        manifest = make_manifest(packer, tokenizer_info, build_fingerprint, [str(f) for f in files], settings)
        write_manifest(tmp_dir, manifest)

    output = Path(output).resolve()
    damage: list[str] = []
    rebuilt = build_atomically(output, MANIFEST_NAME, build_fingerprint, build,
                               check=lambda out: verify_local_shards(out, check_hashes=True), on_damage=damage.append)
    return PrepareResult(output=output, manifest=read_manifest(str(output)), rebuilt=rebuilt,
                         damage=damage[0] if damage else None)
