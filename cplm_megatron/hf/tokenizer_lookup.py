"""Find the tokenizer a Megatron checkpoint was trained with, for its Hugging Face export.

Places, in order: <checkpoint root>/tokenizer (written by convert_from_hf), the tokenizer/ of the
checkpoint the run started from (`checkpoint.load`), and the tokenizer recorded in the manifests of
the run's data streams (the corpus layout keeps it beside the datasets: <data root>/<name> or
<data root>/tokenizer; it must have the recorded hash). Relative paths are taken from the current
directory, as the trainer takes them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from cplm_megatron.hf.config_mapping import ConversionError
from cplm_megatron.hf.megatron_checkpoint import MegatronCheckpoint

log = logging.getLogger(__name__)

TOKENIZER_SUBDIR = "tokenizer"


def _candidates(checkpoint: MegatronCheckpoint) -> Iterator[tuple[Path, str | None]]:
    """(directory, sha256 it must have or None) in lookup order."""
    from cplm_megatron.data.manifest import DatasetError, is_remote, read_manifest

    yield checkpoint.root / TOKENIZER_SUBDIR, None
    start = (checkpoint.config.get("checkpoint") or {}).get("load")
    if start:
        yield Path(start) / TOKENIZER_SUBDIR, None
        yield Path(start).parent / TOKENIZER_SUBDIR, None
    data = checkpoint.config.get("data") or {}
    for stream in [*(data.get("streams") or []), *(data.get("val_streams") or [])]:
        location = stream.get("path", "") if isinstance(stream, dict) else str(stream)
        if not location or is_remote(location):
            continue
        try:
            info = read_manifest(location).tokenizer
        except DatasetError as err:
            log.info("tokenizer lookup: skipping data stream %s (%s)", location, err)
            continue
        for name in dict.fromkeys([info.name, TOKENIZER_SUBDIR]):
            yield Path(location).parent / name, info.sha256


def _is_tokenizer(path: Path, sha256: str | None) -> bool:
    from cplm_megatron.data.tokenizer import TokenizerError, tokenizer_sha256

    if not path.is_dir():
        return False
    try:
        digest = tokenizer_sha256(path)
    except TokenizerError:
        return False
    return sha256 is None or digest == sha256


def find_tokenizer(checkpoint: MegatronCheckpoint) -> Path:
    """The tokenizer directory of `checkpoint`; a clear error naming the places looked in otherwise."""
    looked = []
    for path, sha256 in _candidates(checkpoint):
        if _is_tokenizer(path, sha256):
            return path
        looked.append(str(path) + (f" (sha256 {sha256[:12]})" if sha256 else ""))
    raise ConversionError(
        f"missing tokenizer: none found for {checkpoint.path} (looked in: {', '.join(looked)}); pass --tokenizer DIR"
    )
