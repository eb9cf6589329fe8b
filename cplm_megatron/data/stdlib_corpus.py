"""The embedded default corpus: the running interpreter's Python standard library sources.

Present on every machine, so demos and tests need no download. Modules (``*.py`` under the
``sysconfig`` stdlib path, minus test suites and third-party packages) are split into train and
validation by a hash of their module name, so the split does not depend on the file system or on
which other modules exist. Layout written by `build_stdlib_corpus(DIR)`:

    DIR/tokenizer/   byte-level BPE trained on the training modules only
    DIR/train/       packed MDS dataset + manifest.json
    DIR/val/         packed MDS dataset + manifest.json
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.data.atomic_output import read_marker
from cplm_megatron.data.manifest import DatasetManifest, read_manifest
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.tokenizer import TRAINING_RECORD, TokenizerInfo
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files

EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
DEFAULT_VAL_FRACTION = 0.05
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # above any CPython's non-test stdlib (~12 MB for 3.11)


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def module_name(path: Path, root: Path) -> str:
    """'email/mime/text.py' -> 'email.mime.text'; a package's __init__.py -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _name_hash(name: str, purpose: str) -> float:
    """A stable number in [0, 1) per module name; independent across purposes (cap vs split)."""
    return int.from_bytes(hashlib.sha256(f"{purpose}:{name}".encode()).digest()[:8], "big") / 2**64


def stdlib_sources(root: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Path]:
    """The corpus files, sorted; above `max_bytes` a hash-ordered (deterministic) subset is kept."""
    root = root or stdlib_root()
    files = [
        p for p in root.rglob("*.py")
        if p.is_file() and not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])
    ]
    if not files:
        raise FileNotFoundError(f"no Python sources under {root}: is the standard library installed with sources?")
    chosen, total = [], 0
    for path in sorted(files, key=lambda p: _name_hash(module_name(p, root), "cap")):
        size = path.stat().st_size
        if total + size > max_bytes and chosen:
            continue
        chosen.append(path)
        total += size
    return sorted(chosen)


def split_train_val(
    files: list[Path], root: Path, val_fraction: float = DEFAULT_VAL_FRACTION
) -> tuple[list[Path], list[Path]]:
    """Modules whose name hashes below `val_fraction` go to validation (at least one, if >= 2 files)."""
    val = [p for p in files if _name_hash(module_name(p, root), "split") < val_fraction]
    if not val and len(files) >= 2:
        val = [min(files, key=lambda p: _name_hash(module_name(p, root), "split"))]
    chosen = set(val)
    return [p for p in files if p not in chosen], val


@dataclass
class StdlibCorpus:
    """Paths and descriptions of a built corpus."""

    root: Path
    tokenizer_dir: Path
    train_dir: Path
    val_dir: Path
    tokenizer: TokenizerInfo
    train: DatasetManifest
    val: DatasetManifest
    rebuilt: bool  # False when every part was already up to date


def build_stdlib_corpus(
    output: str | Path,
    vocab_size: int = 4096,
    seq_len: int = 256,
    max_bytes: int = DEFAULT_MAX_BYTES,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    workers: int | None = None,
    show_progress: bool = True,
) -> StdlibCorpus:
    """Build (or confirm up to date) tokenizer + train/val datasets of the stdlib under `output`."""
    output = Path(output).resolve()
    root = stdlib_root()
    train_files, val_files = split_train_val(stdlib_sources(root, max_bytes), root, val_fraction)
    if not train_files or not val_files:
        raise ValueError(f"max_bytes={max_bytes} leaves too few stdlib modules for a train/val split")
    workers = workers if workers is not None else min(4, os.cpu_count() or 1)
    tokenizer = train_tokenizer_from_files(train_files, vocab_size, output / "tokenizer", show_progress=show_progress)
    parts = {}
    for split, files in (("train", train_files), ("val", val_files)):
        parts[split] = prepare_dataset(
            files, tokenizer.output, output / split, seq_len=seq_len, workers=workers, show_progress=show_progress
        )
    return StdlibCorpus(
        root=output,
        tokenizer_dir=tokenizer.output,
        train_dir=parts["train"].output,
        val_dir=parts["val"].output,
        tokenizer=tokenizer.info,
        train=parts["train"].manifest,
        val=parts["val"].manifest,
        rebuilt=tokenizer.rebuilt or parts["train"].rebuilt or parts["val"].rebuilt,
    )


def load_stdlib_corpus(output: str | Path) -> StdlibCorpus:
    """An already built corpus, as it is (no rebuild); raises FileNotFoundError if a part is missing."""
    output = Path(output).resolve()
    record = read_marker(output / "tokenizer", TRAINING_RECORD)
    if record is None or "tokenizer" not in record:
        raise FileNotFoundError(f"no complete stdlib corpus at {output}; build it with tools/build_stdlib_corpus.py")
    return StdlibCorpus(
        root=output,
        tokenizer_dir=output / "tokenizer",
        train_dir=output / "train",
        val_dir=output / "val",
        tokenizer=TokenizerInfo(**record["tokenizer"]),
        train=read_manifest(str(output / "train")),
        val=read_manifest(str(output / "val")),
        rebuilt=False,
    )
