"""The embedded corpus: which stdlib files, the deterministic split, and the built layout."""
from __future__ import annotations

import json
from pathlib import Path

from cplm_megatron.data.stdlib_corpus import (
    EXCLUDED_DIRS,
    VAL_MAX_BYTES,
    VAL_MIN_BYTES,
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
    assert 0.1 < len(val) / len(files) < 0.3
    assert all(VAL_MIN_BYTES <= f.stat().st_size <= VAL_MAX_BYTES for f in val)
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


def test_three_way_split_keeps_validation_and_cleans_held_out_files(tmp_path: Path) -> None:
    from cplm_megatron.data.stdlib_corpus import clean_held_out, is_generated, split_three_ways

    root = stdlib_root()
    files = stdlib_sources(root)
    train, dev, val = split_three_ways(files, root)
    _, val_two_way = split_train_val(files, root)
    assert val == val_two_way  # adding the dev split leaves validation as it was
    assert not set(train) & set(dev) and not set(dev) & set(val) and sorted(train + dev + val) == files
    assert 0.02 < len(dev) / len(files) < 0.09
    assert is_generated(root / "encodings" / "cp1252.py") and not is_generated(root / "json" / "decoder.py")
    original = tmp_path / "original.py"
    original.write_text(" ".join(f"word{i}" for i in range(400)))
    copy = tmp_path / "copy.py"
    copy.write_text(" ".join(f"word{i}" for i in range(200)) + " " + " ".join(f"other{i}" for i in range(200)))
    distinct = tmp_path / "distinct.py"
    distinct.write_text(" ".join(f"fresh{i}" for i in range(400)))
    codec = root / "encodings" / "cp1252.py"
    new_train, kept, moved = clean_held_out([original], {"val": [copy, distinct, codec]})
    assert kept == {"val": [distinct]} and set(new_train) == {original, copy, codec}
    reasons = {Path(m["file"]).name: m["reason"] for m in moved}
    assert reasons["cp1252.py"] == "generated" and reasons["copy.py"].startswith("near-duplicate (48%")  # 185 of 385 shingles


def test_verbatim_overlap_counts_shared_windows(stdlib_corpus: StdlibCorpus, tmp_path: Path) -> None:
    from cplm_megatron.data.stdlib_corpus import verbatim_overlap

    text = " ".join(f"token{i} = value{i}" for i in range(300))
    same, half = tmp_path / "a.py", tmp_path / "b.py"
    same.write_text(text)
    half.write_text(text[: len(text) // 2] + " ".join(f"fresh{i} != other{i}" for i in range(300)))
    full = verbatim_overlap(stdlib_corpus.tokenizer_dir, [same], [same])
    assert full["fraction_in_train"] == 1.0 and full["windows"] > 100
    part = verbatim_overlap(stdlib_corpus.tokenizer_dir, [same], [half])
    assert 0.2 < part["fraction_in_train"] < 0.8
    both = verbatim_overlap(stdlib_corpus.tokenizer_dir, [same], {"val": [same], "dev": [half]})
    assert both == {"val": full, "dev": part}  # one record per split, training windows hashed once


def test_validation_split_can_rank_arms(stdlib_corpus: StdlibCorpus) -> None:
    """The recipe study's validation set: >= 100 documents, >= 150k tokens, no document above 5% of its tokens,
    verbatim overlap with train below 2% (split.json reports each)."""
    from cplm_megatron.data.stdlib_corpus import MAX_DOCUMENT_SHARE

    record = stdlib_corpus.split
    sizes = record["sizes"]["val"]
    assert sizes["documents"] == stdlib_corpus.val.documents >= 100
    assert sizes["tokens"] >= 150_000
    assert sizes["largest_document_share"] <= MAX_DOCUMENT_SHARE
    assert sizes["largest_document_tokens"] / sizes["tokens"] == sizes["largest_document_share"]
    assert record["verbatim_overlap"]["val"]["fraction_in_train"] < 0.02
    assert record["verbatim_overlap"]["dev"]["fraction_in_train"] < 0.02
    assert record["sizes"]["dev"]["documents"] == stdlib_corpus.dev.documents > 0
    assert "val_fraction" in record["drawn"]
