"""Tokenizers: train a byte-level BPE, load any local Hugging Face tokenizer directory, describe it.

A tokenizer is always a local directory that `transformers.AutoTokenizer` can load (one we trained,
or one a user copied in, e.g. SmolLM2's). Its end-of-document (EOD) token is its EOS token; our
trained tokenizers use one special token as EOD, BOS, EOS and padding.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.data.atomic_output import write_marker
from cplm_megatron.errors import UserError

DEFAULT_EOD_TOKEN = "<|endoftext|>"
TRAINING_RECORD = "cplm_tokenizer.json"  # written last by train_bpe_tokenizer: how it was made
# Files that define tokenization (hashed to identify a tokenizer); others (README...) are ignored.
TOKENIZER_DEFINING_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)

PathLike = str | Path


class TokenizerError(UserError):
    """A tokenizer directory that cannot be used; the message names it and the fix."""


@dataclass(frozen=True)
class TokenizerInfo:
    """Identity of a tokenizer as recorded in dataset manifests."""

    name: str
    sha256: str
    vocab_size: int  # len(tokenizer): base vocabulary plus added tokens
    eod_id: int
    eod_token: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON manifests."""
        return asdict(self)


def tokenizer_sha256(path: PathLike) -> str:
    """sha256 over the tokenization-defining files of a tokenizer directory (name + bytes)."""
    path = Path(path)
    digest = hashlib.sha256()
    found = False
    for name in TOKENIZER_DEFINING_FILES:
        file = path / name
        if file.is_file():
            found = True
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    if not found:
        raise TokenizerError(
            f"{path} is not a tokenizer directory (none of {', '.join(TOKENIZER_DEFINING_FILES)} present); "
            f"train one with tools/train_tokenizer.py or copy in a Hugging Face tokenizer"
        )
    return digest.hexdigest()


def load_tokenizer(path: PathLike) -> Any:
    """The `transformers` tokenizer saved in local directory `path` (no hub access, no remote code)."""
    path = Path(path)
    if not path.is_dir():
        raise TokenizerError(f"tokenizer directory not found: {path}")
    tokenizer_sha256(path)  # fails early with a clear message if the directory holds no tokenizer
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except Exception as e:  # transformers raises OSError/ValueError/KeyError depending on what is wrong
        raise TokenizerError(f"cannot load the tokenizer in {path}: {type(e).__name__}: {e}") from e


def eod_id_of(tokenizer: Any, path: PathLike) -> int:
    """The tokenizer's end-of-document id (its EOS token)."""
    if tokenizer.eos_token_id is None:
        raise TokenizerError(
            f"tokenizer {path} has no EOS token to separate documents; set `eos_token` in its "
            f"tokenizer_config.json (e.g. to {DEFAULT_EOD_TOKEN!r})"
        )
    return int(tokenizer.eos_token_id)


def describe_tokenizer(path: PathLike, tokenizer: Any = None, name: str | None = None) -> TokenizerInfo:
    """Identity (name, hash, vocab size, EOD) of the tokenizer in `path` (loaded unless given);
    the name defaults to the directory's name."""
    path = Path(path).resolve()
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(path)
    eod_id = eod_id_of(tokenizer, path)
    return TokenizerInfo(
        name=name or path.name,
        sha256=tokenizer_sha256(path),
        vocab_size=len(tokenizer),
        eod_id=eod_id,
        eod_token=str(tokenizer.convert_ids_to_tokens(eod_id)),
    )


def backend_json(tokenizer: Any, path: PathLike) -> str:
    """The Rust `tokenizers` definition behind a fast HF tokenizer (to rebuild it in workers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenizerError(
            f"tokenizer {path} is not a fast (Rust) tokenizer; convert it once with "
            f"AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(...)"
        )
    return backend.to_str()


def train_bpe_tokenizer(
    documents: Iterable[str],
    vocab_size: int,
    output_dir: PathLike,
    eod_token: str = DEFAULT_EOD_TOKEN,
    min_frequency: int = 2,
    show_progress: bool = True,
    record: dict[str, Any] | None = None,
    name: str | None = None,
) -> TokenizerInfo:
    """Train a byte-level BPE on `documents` and save it as an HF tokenizer directory.

    The EOD token gets id 0 and serves as BOS, EOS and padding token. `record` (how the tokenizer
    was made) is stored in `TRAINING_RECORD`, written last. `name` defaults to the directory's.
    """
    if vocab_size < 257:
        raise TokenizerError(f"vocab_size={vocab_size} is too small: byte-level BPE needs > 256 (256 bytes + EOD)")
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eod_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(documents, trainer)

    output_dir = Path(output_dir)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=eod_token, eos_token=eod_token, pad_token=eod_token
    )
    hf.save_pretrained(str(output_dir))
    _portable_tokenizer_class(output_dir / "tokenizer_config.json")
    info = describe_tokenizer(output_dir, name=name)
    write_marker(output_dir, TRAINING_RECORD, {**(record or {}), "tokenizer": info.to_dict()})
    return info


def _portable_tokenizer_class(config_path: Path) -> None:
    """Name the class transformers 4.x and 5.x both know (5.x writes 'TokenizersBackend')."""
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
