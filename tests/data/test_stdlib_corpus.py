"""The embedded corpus: which stdlib files, the deterministic split, and the built layout."""
from __future__ import annotations

import json
from pathlib import Path

from cplm_megatron.data.stdlib_corpus import (
    EXCLUDED_DIRS,
    StdlibCorpus,
    module_name,
    split_train_val,
    stdlib_root,
    stdlib_sources,
)


def test_sources_exclude_tests_and_are_capped_deterministically() -> None:
    root = stdlib_root()
    files = stdlib_sources(root)
    assert len(files) > 100 and files == sorted(files)
    assert not any(EXCLUDED_DIRS.intersection(f.relative_to(root).parts[:-1]) for f in files)
    assert root / "json" / "decoder.py" in files and not any("site-packages" in str(f) for f in files)
    capped = stdlib_sources(root, max_bytes=200_000)
    assert capped == stdlib_sources(root, max_bytes=200_000)
    assert set(capped) < set(files) and sum(f.stat().st_size for f in capped) <= 200_000


def test_split_is_by_module_name_and_stable() -> None:
    root = stdlib_root()
    files = stdlib_sources(root)
    train, val = split_train_val(files, root)
    assert not set(train) & set(val) and sorted(train + val) == files
    assert 0.02 < len(val) / len(files) < 0.09
    # a module's side depends only on its own name, not on which other files are present
    _, val_of_subset = split_train_val(files[::3], root)
    assert set(val_of_subset) == set(val) & set(files[::3])
    assert module_name(root / "email" / "mime" / "text.py", root) == "email.mime.text"
    assert module_name(root / "json" / "__init__.py", root) == "json"
    _, tiny_val = split_train_val(files[:3], root, val_fraction=0.0)
    assert len(tiny_val) == 1  # at least one validation module


def test_built_corpus_layout(stdlib_corpus: StdlibCorpus) -> None:
    for part in ("tokenizer", "train", "val"):
        assert (stdlib_corpus.root / part).is_dir()
    train = set(stdlib_corpus.train.source_files)
    val = set(stdlib_corpus.val.source_files)
    assert train and val and not train & val
    assert stdlib_corpus.train.tokenizer == stdlib_corpus.val.tokenizer == stdlib_corpus.tokenizer
    record = json.loads((stdlib_corpus.tokenizer_dir / "cplm_tokenizer.json").read_text())
    assert set(record["source_files"]) == train  # the tokenizer never saw validation modules
    assert all(Path(f).suffix == ".py" for f in train | val)
