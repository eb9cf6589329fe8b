"""MDS shards of packed samples: the column layout, writing, and checking local shards on disk.

Columns per sample: ``tokens`` (``seq_len + 1`` ids, uint16 or uint32 by vocabulary size),
``segment_starts`` (int32 offsets, see `packing`), ``num_tokens`` (int32). Shards are
zstd-compressed and carry xxh3_64 hashes of both their compressed and raw bytes.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from cplm_megatron.data.manifest import DatasetError, DatasetManifest
from cplm_megatron.data.packing import PackedSample, SamplePacker
from cplm_megatron.data.tokenizer import TokenizerInfo

INDEX_NAME = "index.json"
SHARD_HASH = "xxh3_64"
COMPRESSION = "zstd"
DEFAULT_SHARD_SIZE_LIMIT = "64mb"


def mds_columns(seq_len: int, token_dtype: str) -> dict[str, str]:
    """MDS column encodings of a packed dataset."""
    return {
        "tokens": f"ndarray:{token_dtype}:{seq_len + 1}",
        "segment_starts": "ndarray:int32",
        "num_tokens": "int32",
    }


def _encode(sample: PackedSample) -> dict:
    return {"tokens": sample.tokens, "segment_starts": sample.segment_starts, "num_tokens": sample.num_tokens}


def write_packed_samples(
    token_docs: Iterable[Sequence[int]],
    directory: Path,
    seq_len: int,
    tokenizer: TokenizerInfo,
    shard_size_limit: str | int = DEFAULT_SHARD_SIZE_LIMIT,
) -> SamplePacker:
    """Pack tokenized documents (EOD added here) into MDS shards in `directory`; returns the counts.

    Raises DatasetError when there is no document at all (an empty dataset is always a mistake).
    """
    from cplm_megatron.data._streaming_import import MDSWriter

    packer = SamplePacker(seq_len, tokenizer.eod_id, tokenizer.vocab_size)
    columns = mds_columns(seq_len, packer.dtype.name)
    with MDSWriter(
        out=str(directory), columns=columns, compression=COMPRESSION, hashes=[SHARD_HASH],
        size_limit=shard_size_limit,
    ) as writer:
        for doc in token_docs:
            for sample in packer.add_document(doc):
                writer.write(_encode(sample))
        for sample in packer.finish():
            writer.write(_encode(sample))
    if packer.documents == 0:
        raise DatasetError("the input holds no documents (every file was empty); nothing to write")
    return packer


def make_manifest(
    packer: SamplePacker,
    tokenizer: TokenizerInfo,
    fingerprint: str,
    source_files: Sequence[str],
    settings: dict | None = None,
) -> DatasetManifest:
    """The manifest describing what `packer` wrote."""
    return DatasetManifest(
        seq_len=packer.seq_len,
        documents=packer.documents,
        tokens=packer.tokens,
        samples=packer.samples,
        padding_tokens=packer.padding_tokens,
        token_dtype=packer.dtype.name,
        tokenizer=tokenizer,
        source_files=[str(f) for f in source_files],
        fingerprint=fingerprint,
        settings=dict(settings or {}),
    )


def verify_local_shards(directory: Path, check_hashes: bool = True) -> int:
    """Check every shard listed in index.json is on disk, whole (size) and, optionally, unaltered
    (xxh3_64). Returns the number of samples. Raises DatasetError naming the bad file."""
    import xxhash

    directory = Path(directory)
    index_path = directory / INDEX_NAME
    if not index_path.is_file():
        raise DatasetError(f"{index_path} is missing: {directory} holds no shards; re-run tools/prepare_data.py")
    try:
        shards = json.loads(index_path.read_text())["shards"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise DatasetError(f"{index_path} is corrupt ({e}); re-run tools/prepare_data.py") from e
    samples = 0
    for shard in shards:
        candidates = [shard.get("raw_data"), shard.get("zip_data")]
        present = [info for info in candidates if info and (directory / info["basename"]).is_file()]
        if not present:
            names = " or ".join(info["basename"] for info in candidates if info)
            raise DatasetError(f"shard missing: {directory / names} (listed in {index_path}); re-run tools/prepare_data.py")
        for info in present:
            path = directory / info["basename"]
            size = path.stat().st_size
            if size != info["bytes"]:
                raise DatasetError(
                    f"shard corrupt: {path} has {size} bytes but {INDEX_NAME} says {info['bytes']} "
                    f"(truncated or overwritten); re-run tools/prepare_data.py"
                )
            expected = info.get("hashes", {}).get(SHARD_HASH)
            if check_hashes and expected is not None:
                actual = xxhash.xxh3_64(path.read_bytes()).hexdigest()
                if actual != expected:
                    raise DatasetError(
                        f"shard corrupt: {path} has {SHARD_HASH} {actual} but {INDEX_NAME} says "
                        f"{expected}; re-run tools/prepare_data.py"
                    )
        samples += int(shard["samples"])
    return samples
