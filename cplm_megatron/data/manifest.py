"""The dataset manifest (``manifest.json``): what a prepared dataset holds and how it was made.

Written last by `prepare_dataset`, so its presence marks a complete dataset. Loaders read it (from
a local directory or an object store) to check a dataset against the run's config before reading
any shard: sequence length, tokenizer vocabulary vs the model's, and one tokenizer across streams.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cplm_megatron.data.tokenizer import TokenizerInfo
from cplm_megatron.errors import UserError

MANIFEST_NAME = "manifest.json"
FORMAT = "cplm-packed-mds/1"
PACKING = (
    "sample i = stream[i*seq_len : i*seq_len + seq_len + 1] of the EOD-separated document stream; "
    "the last sample is padded with EOD from num_tokens on (loss-masked by the loader)"
)


class DatasetError(UserError):
    """A dataset that cannot be used as configured; the message names the file/values and the fix."""


def is_remote(location: str) -> bool:
    """Whether a dataset location is an object-store URL (s3://, gs://, ...) rather than a local path."""
    return "://" in str(location)


@dataclass
class DatasetManifest:
    """Contents of manifest.json."""

    seq_len: int
    documents: int
    tokens: int  # real tokens: documents plus one EOD each
    samples: int
    padding_tokens: int
    token_dtype: str
    tokenizer: TokenizerInfo
    source_files: list[str]
    fingerprint: str  # of the inputs and settings; equal fingerprints mean an identical build
    format: str = FORMAT
    packing: str = PACKING
    settings: dict[str, Any] = field(default_factory=dict)  # split_by, text_field, read statistics

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        out = asdict(self)
        out["tokenizer"] = self.tokenizer.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> DatasetManifest:
        """Parse a manifest dict; `where` names its file in errors."""
        if data.get("format") != FORMAT:
            raise DatasetError(
                f"{where}: format {data.get('format')!r} is not {FORMAT!r}; re-run tools/prepare_data.py"
            )
        try:
            values = dict(data)
            values["tokenizer"] = TokenizerInfo(**values["tokenizer"])
            return cls(**values)
        except (KeyError, TypeError) as e:
            raise DatasetError(f"{where}: malformed manifest ({e}); re-run tools/prepare_data.py") from e


def write_manifest(directory: Path, manifest: DatasetManifest) -> None:
    """Write manifest.json into `directory` (the last file of a dataset build)."""
    (Path(directory) / MANIFEST_NAME).write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n")


def _fetch_remote(url: str, scratch_dir: Path | None) -> dict[str, Any]:
    from cplm_megatron.data._streaming_import import CloudDownloader

    scratch_dir = Path(scratch_dir or tempfile.gettempdir())
    scratch_dir.mkdir(parents=True, exist_ok=True)
    fd, local = tempfile.mkstemp(prefix="manifest-", suffix=".json", dir=scratch_dir)
    os.close(fd)
    os.remove(local)  # the downloader skips files that already exist
    try:
        CloudDownloader.direct_download(url, local)
        return json.loads(Path(local).read_text())
    except Exception as e:  # botocore/ google clients raise their own types
        raise DatasetError(
            f"cannot read {url}: {type(e).__name__}: {e}; is this a dataset written by "
            f"tools/prepare_data.py, and are the credentials/endpoint (S3_ENDPOINT_URL) set?"
        ) from e
    finally:
        if os.path.exists(local):
            os.remove(local)


def read_manifest(location: str, scratch_dir: Path | None = None) -> DatasetManifest:
    """The manifest of the dataset at `location` (local directory or object-store URL)."""
    if is_remote(location):
        where = location.rstrip("/") + "/" + MANIFEST_NAME
        data = _fetch_remote(where, scratch_dir)
    else:
        path = Path(location) / MANIFEST_NAME
        where = str(path)
        if not Path(location).is_dir():
            raise DatasetError(f"dataset directory not found: {location}; prepare one with tools/prepare_data.py "
                               f"(docs/data.md), or `make data` for the small embedded corpus (data/stdlib/)")
        if not path.is_file():
            raise DatasetError(
                f"{location} is not a prepared dataset (no {MANIFEST_NAME}; an interrupted build "
                f"never writes one); build it with tools/prepare_data.py"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: not valid JSON ({e}); re-run tools/prepare_data.py") from e
    if not isinstance(data, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    return DatasetManifest.from_dict(data, where)


def check_compatible(
    manifests: Sequence[tuple[str, DatasetManifest]], seq_len: int, model_vocab_size: int | None
) -> TokenizerInfo:
    """Check datasets against the run (seq_len, model vocab) and each other; returns their tokenizer."""
    if not manifests:
        raise DatasetError("no datasets configured")
    first_location, first = manifests[0]
    for location, manifest in manifests:
        if manifest.seq_len != seq_len:
            raise DatasetError(
                f"{location}: shards hold samples of seq_len {manifest.seq_len} but the config has "
                f"seq_len {seq_len}; set train.seq_len={manifest.seq_len} or re-run "
                f"tools/prepare_data.py --seq-len {seq_len}"
            )
        if manifest.tokenizer.sha256 != first.tokenizer.sha256:
            raise DatasetError(
                f"{location} was tokenized with {manifest.tokenizer.name!r} "
                f"(sha256 {manifest.tokenizer.sha256[:12]}) but {first_location} with "
                f"{first.tokenizer.name!r} (sha256 {first.tokenizer.sha256[:12]}); all streams must share "
                f"one tokenizer"
            )
        if model_vocab_size is not None and manifest.tokenizer.vocab_size > model_vocab_size:
            raise DatasetError(
                f"{location}: its tokenizer ({manifest.tokenizer.name!r}) has {manifest.tokenizer.vocab_size} "
                f"tokens but the model's vocabulary has only {model_vocab_size}; set model.vocab_size to at "
                f"least {manifest.tokenizer.vocab_size} or use a smaller tokenizer"
            )
    return first.tokenizer
