"""The code corpus (cplm_megatron.data.code_corpus): installed sources by distribution, the split by distribution,
content dedup and held-out cleaning, the size rules, and a small real build (twice: the same bytes)."""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from cplm_megatron.data.code_corpus import (
    MAX_HELD_OUT,
    CodeCorpusSettings,
    SizeRules,
    assign_splits,
    check_size_rules,
    deduplicate,
    interleave_by_distribution,
    remove_near_duplicates,
    split_distributions,
    usable_bytes,
)
from cplm_megatron.data.code_sources import (
    NO_METADATA_LICENCE,
    STDLIB,
    STDLIB_LICENCE,
    Distribution,
    installed_distributions,
    limit_distributions,
    read_distributions,
)

REPO = Path(__file__).resolve().parents[2]
WORDS = [f"w{i}" for i in range(5000)]


def _install(root: Path, name: str, version: str, files: dict[str, str | bytes], meta: str = "") -> None:
    """A distribution as pip leaves it: its files and a dist-info with METADATA (plus `meta`'s fields) and RECORD."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/RECORD,,\n")


def _code(seed: int, words: int = 300) -> str:
    return " ".join(WORDS[(seed * 7919 + i * 31) % len(WORDS)] for i in range(words)) + "\n"


def test_installed_sources_belong_to_their_distribution(tmp_path: Path) -> None:
    """Files map to the distribution whose RECORD lists them (names normalized, versions kept); a file no RECORD
    lists belongs to unowned-<top level>; non-UTF-8, NUL and empty files are left out and counted."""
    _install(tmp_path, "Alpha_Pkg", "1.2", {"alpha/__init__.py": _code(1), "alpha/core.py": _code(2),
                                            "alpha/latin.py": "x = 'caf\xe9'\n".encode("latin-1"),
                                            "alpha/empty.py": "\n"})
    _install(tmp_path, "beta", "0.1", {"beta.py": _code(3), "beta_nul.py": b"a\x00b"})
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "mod.py").write_text(_code(4))
    (tmp_path / "loose" / "dangling.py").symlink_to(tmp_path / "nowhere.py")  # a dangling link is not listed
    listed = installed_distributions([tmp_path], include_stdlib=False)
    assert [(d.name, d.version, [f.relpath for f in d.files]) for d in listed] == [
        ("alpha-pkg", "1.2", ["alpha/__init__.py", "alpha/core.py", "alpha/empty.py", "alpha/latin.py"]),
        ("beta", "0.1", ["beta.py", "beta_nul.py"]), ("unowned-loose", "", ["loose/mod.py"])]
    dists, skipped = read_distributions(listed)
    assert [len(d.files) for d in dists] == [2, 1, 1] and skipped.to_dict() == {"not_utf8": 2, "empty": 1,
                                                                                  "too_large": 0, "unreadable": 0}
    assert dists[0].files[0].digest == hashlib.sha256(_code(1).encode()).hexdigest()
    assert [d.name for d in limit_distributions(dists, ["Beta"])] == ["beta"]
    with pytest.raises(ValueError, match="not installed here"):
        limit_distributions(dists, ["gamma"])
    capped = limit_distributions(dists, max_bytes=dists[0].bytes + 10)
    assert sum(d.bytes for d in capped) <= dists[0].bytes + 10 and capped == limit_distributions(
        dists, max_bytes=dists[0].bytes + 10)


def test_each_distribution_carries_the_licence_its_metadata_states(tmp_path: Path) -> None:
    """License-Expression first, else a one-line License field, else the License classifiers, else the first line
    of a licence text; "not stated" without any; files no distribution lists have no metadata to state one; the
    standard library is PSF-2.0."""
    _install(tmp_path, "expr", "1.0", {"expr.py": _code(1)},
             "License-Expression: LGPL-2.1-or-later\nClassifier: License :: OSI Approved :: MIT License\n")
    _install(tmp_path, "field", "1.0", {"field.py": _code(2)}, "License: BSD 3-Clause License\n")
    _install(tmp_path, "classified", "1.0", {"classified.py": _code(3)},
             "License: UNKNOWN\nClassifier: License :: OSI Approved :: MIT License\n")
    _install(tmp_path, "fulltext", "1.0", {"fulltext.py": _code(6)},
             "License: ====\n        Copyright (c) 2005, Foo Developers.\n        All rights reserved.\n")
    _install(tmp_path, "silent", "1.0", {"silent.py": _code(4)})
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "mod.py").write_text(_code(5))
    listed = installed_distributions([tmp_path])
    assert [d.licence for d in listed if d.name == STDLIB] == [STDLIB_LICENCE]
    dists, _ = read_distributions([d for d in listed if d.name != STDLIB])  # reading keeps each licence
    assert {d.name: d.licence for d in dists} == {
        "classified": "MIT License", "expr": "LGPL-2.1-or-later", "field": "BSD 3-Clause License",
        "fulltext": "Copyright (c) 2005, Foo Developers. (the licence text in its metadata)", "silent": "not stated",
        "unowned-loose": NO_METADATA_LICENCE}


def _corpus(tmp_path: Path) -> list[Distribution]:
    """40 small distributions of distinct text; a held-out candidate holds a copy of a training file, a
    near-copy of one, a generated file and an oversized one."""
    for i in range(40):
        _install(tmp_path, f"pkg{i:02d}", "1.0", {f"pkg{i:02d}/m{j}.py": _code(100 * i + j) for j in range(3)})
    dists, _ = read_distributions(installed_distributions([tmp_path], include_stdlib=False))
    return dists


def test_split_is_by_distribution_and_held_out_splits_hold_no_training_content(tmp_path: Path) -> None:
    settings = CodeCorpusSettings(val_fraction=0.2, dev_fraction=0.1, max_distribution_share=1.0,
                                  max_document_share=0.1)
    dists = _corpus(tmp_path)
    splits = assign_splits(dists, settings)
    names = {split: {d.name for d in ds} for split, ds in splits.items()}
    assert not names["train"] & names["val"] and not names["train"] & names["dev"] and not names["val"] & names["dev"]
    assert sum(map(len, names.values())) == 40 and names["val"] and names["dev"]
    assert assign_splits(list(reversed(dists)), settings) == splits  # by name hash, not by listing order
    # plant training content into a validation distribution: an exact copy, a near copy (>= 10% of its shingles),
    # a generated module and an oversized one; then they must all be left out of validation, nothing moves to train
    val_dir = splits["val"][0].files[0].path.parent
    train_file = splits["train"][0].files[0].path
    (val_dir / "copy.py").write_bytes(train_file.read_bytes())
    (val_dir / "near.py").write_text(train_file.read_text()[:600] + _code(9999))
    (val_dir / "gen.py").write_text("# Generated by the protocol buffer compiler.  DO NOT EDIT!\n" + _code(8888))
    (val_dir / "big.py").write_text(_code(7777, words=1000))  # above 10% of the validation split's bytes
    planted = splits["val"][0].name
    dists = _corpus_reread(tmp_path, planted, val_dir)
    splits = assign_splits(dists, settings)
    assert planted in {d.name for d in splits["val"]}
    clean = remove_near_duplicates(deduplicate(splits, settings), settings)
    val_files = {f.relpath.rsplit("/", 1)[1] for _, f in clean.files["val"]}
    assert not val_files & {"copy.py", "near.py", "gen.py", "big.py"}
    reasons = {d["file"].rsplit("/", 1)[1]: d["reason"] for d in clean.dropped_held_out}
    assert reasons["copy.py"] == "duplicate content" and reasons["gen.py"] == "generated"
    assert reasons["near.py"].startswith("near-duplicate") and reasons["big.py"].startswith("above")
    assert {f.relpath for _, f in clean.files["train"]} == {f.relpath for d in splits["train"] for f in d.files}
    train_digests = {f.digest for _, f in clean.files["train"]}
    assert not train_digests & {f.digest for _, f in clean.files["val"]}
    assert clean.overlap["val"]["largest_file_fraction"] < settings.near_duplicate


def _corpus_reread(tmp_path: Path, name: str, directory: Path) -> list[Distribution]:
    """Add the planted files to `name`'s RECORD and list everything again."""
    record = next(tmp_path.glob(f"{name}-*.dist-info")) / "RECORD"
    extra = "".join(f"{directory.name}/{f}.py,,\n" for f in ("copy", "near", "gen", "big"))
    record.write_text(record.read_text() + extra)
    dists, _ = read_distributions(installed_distributions([tmp_path], include_stdlib=False))
    return dists


def _passing_record() -> dict:
    return {"splits": {"train": {"tokens": 60_000_000}, "val": {"documents": 900, "tokens": 2_500_000,
                                                               "largest_document_share": 0.007}},
            "tokenizer": {"vocab_size": 49152}, "settings": {"near_duplicate": 0.1},
            "held_out_overlap": {s: {"files_in_train": 0, "largest_file_fraction": 0.09} for s in ("dev", "val")}}


@pytest.mark.parametrize("path, value, broken", [
    (("splits", "train", "tokens"), 49_999_999, "train tokens"),
    (("splits", "val", "documents"), 499, "validation documents"),
    (("splits", "val", "tokens"), 1_999_999, "validation tokens"),
    (("splits", "val", "largest_document_share"), 0.0101, "the largest validation document"),
    (("tokenizer", "vocab_size"), 36_533, "vocabulary"),
    (("held_out_overlap", "val", "files_in_train"), 1, "val holds training content"),
    (("held_out_overlap", "dev", "largest_file_fraction"), 0.1, "dev holds training content"),
])
def test_size_rules_name_each_broken_rule(path: tuple, value: float, broken: str) -> None:
    assert check_size_rules(_passing_record()) == []
    record = _passing_record()
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    [failure] = check_size_rules(record, SizeRules())
    assert failure.startswith(broken)


SMALL = ["--max-bytes", "2500000", "--vocab-size", "512", "--seq-len", "128", "--val-fraction", "0.15",
         "--dev-fraction", "0.05", "--max-distribution-share", "0.6", "--max-document-share", "0.05",
         "--tokenizer-sample-bytes", "400000", "--quiet"]


def _index_hashes(directory: Path) -> list:
    index = json.loads((directory / "index.json").read_text())
    return [(s["raw_data"]["basename"], s["raw_data"]["hashes"], s["raw_data"]["bytes"]) for s in index["shards"]]


def test_small_build_is_deterministic_and_split_by_distribution(tmp_path: Path) -> None:
    """The same package subset built in this process and by the CLI in another (another hash seed, 2 workers):
    the same tokenizer and the same shards; split.json names every split's documents and tokens, each
    distribution's split and version, and no validation file's content is a training file's."""
    from tools.build_code_corpus import main as build_main

    assert build_main(["--output", str(tmp_path / "a"), *SMALL, "--workers", "1"]) == 0
    cli = subprocess.run([sys.executable, "tools/build_code_corpus.py", "--output", str(tmp_path / "b"), *SMALL,
                          "--workers", "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-3000:]
    a, b = (json.loads((tmp_path / x / "split.json").read_text()) for x in "ab")
    assert (tmp_path / "a/tokenizer/tokenizer.json").read_bytes() == (tmp_path / "b/tokenizer/tokenizer.json").read_bytes()
    for split in ("train", "dev", "val"):
        assert _index_hashes(tmp_path / "a" / split) == _index_hashes(tmp_path / "b" / split)
        assert a["splits"][split] == b["splits"][split] and a["splits"][split]["tokens"] > 0
    assert a["distributions"] == b["distributions"] and a["tokenizer"]["vocab_size"] == 512
    by_split: dict[str, set] = {}
    for dist in a["distributions"]:
        by_split.setdefault(dist["split"], set()).add(dist["name"])
        assert "version" in dist and dist["licence"]  # every source's licence in the manifest
    assert set(by_split) == {"train", "dev", "val"} and len(set.union(*by_split.values())) == len(a["distributions"])

    def digests(split: str) -> set[str]:
        manifest = json.loads((tmp_path / "a" / split / "manifest.json").read_text())
        return {hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in manifest["source_files"]}

    assert not digests("val") & digests("train") and not digests("dev") & digests("train")
    assert a["held_out_overlap"]["val"]["files_in_train"] == 0


def _random_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "\n"


def _package_set(root: Path, kind: str) -> list[Distribution]:
    """A small package set of one shape: `singles` (many one-file packages), `lopsided` (two packages hold most
    bytes, as torch and transformers do on the GPU image, beside medium and small ones), `few` (eight packages of
    fifteen files) or `giants` (three packages hold nearly every byte: the small ones are all the held-out splits
    can take, as in the GPU check's dry run)."""
    shapes = {"singles": [(1, 300)] * 80, "lopsided": [(120, 400)] * 2 + [(20, 300)] * 10 + [(2, 200)] * 30,
              "few": [(15, 300)] * 8, "giants": [(80, 300)] * 3 + [(1, 300)] * 10}[kind]
    for i, (files, words) in enumerate(shapes):
        _install(root, f"{kind}{i:02d}", "1.0", {f"{kind}{i:02d}/m{j}.py": _random_text(1000 * i + j, words + 7 * j)
                                                 for j in range(files)})
    dists, _ = read_distributions(installed_distributions([root], include_stdlib=False))
    return dists


@pytest.mark.parametrize("kind", ["singles", "lopsided", "few", "giants"])
def test_the_split_adapts_to_the_package_set(tmp_path: Path, kind: str) -> None:
    """With the GPU's split rules (the defaults: validation 4%, dev 1%, a distribution <= 25% and a document <= 0.4%
    of its split), which none of these sets can meet, each held-out split relaxes its rule rung by rung and says
    so; what it takes still obeys the rule it names, and the giants stay in train. Where validation's loosest rung
    would take every small package, it leaves dev some (it took them all, and the GPU check's dry run failed with
    'no distribution fits the dev split')."""
    settings = CodeCorpusSettings()
    dists = _package_set(tmp_path, kind)
    plan = split_distributions(dists, settings)
    assert split_distributions(list(reversed(dists)), settings) == plan  # by name hash, not listing order
    names = {split: {d.name for d in ds} for split, ds in plan.splits.items()}
    assert names["val"] and names["dev"] and not names["val"] & names["dev"]
    assert names["train"] == {d.name for d in dists} - names["val"] - names["dev"] and names["train"]
    total = sum(d.bytes for d in dists)
    assert set(plan.adapted) == {"val", "dev"}
    for split in ("val", "dev"):
        rule = plan.rules[split]
        assert plan.adapted[split].startswith(f"{split}: the asked 4.0%" if split == "val" else f"{split}: the asked 1.0%")
        assert rule.fraction + plan.rules["val" if split == "dev" else "dev"].fraction <= MAX_HELD_OUT
        for dist in plan.splits[split]:
            assert dist.bytes <= rule.distribution_share * rule.fraction * total
            assert usable_bytes(dist, rule.document_cap(total)) >= dist.bytes / 2
    if kind in ("lopsided", "giants"):
        assert {f"{kind}00", f"{kind}01"} <= names["train"]


def test_a_package_set_too_small_to_split_is_one_line(tmp_path: Path) -> None:
    dists = _package_set(tmp_path, "few")[:2]
    with pytest.raises(ValueError, match="no distribution fits the val split: 2 distributions") as err:
        split_distributions(dists, CodeCorpusSettings())
    assert "\n" not in str(err.value) and "include more packages" in str(err.value)


def test_held_out_files_take_turns_by_distribution(tmp_path: Path) -> None:
    """The first validation files (the first samples scored) come from different distributions."""
    dists = _package_set(tmp_path, "few")
    files = [(d.name, f) for d in dists[:3] for f in d.files]
    order = interleave_by_distribution(files)
    assert sorted(order, key=lambda x: x[1].relpath) == sorted(files, key=lambda x: x[1].relpath)
    assert [name for name, _ in order[:6]] == [d.name for d in dists[:3]] * 2


def test_build_refuses_a_missing_root_and_names_undecodable_sources(tmp_path: Path, capsys) -> None:
    """`--root /nonexistent` is one line and exit 2 (it built from every installed distribution before); a source
    that is not UTF-8 text under a root is named with its reason, on the console and in split.json. The build
    takes the GPU's split rules on a small package set (the split adapts)."""
    from tools.build_code_corpus import main as build_main

    missing = subprocess.run([sys.executable, "tools/build_code_corpus.py", "--output", str(tmp_path / "x"),
                              "--root", str(tmp_path / "nonexistent")], cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "no such directory" in missing.stderr and not (tmp_path / "x").exists()
    assert build_main(["--output", str(tmp_path / "x"), "--workers", "-3"]) == 2
    assert capsys.readouterr().err == ("error: --workers must be >= 1 (tokenizer processes), got -3; leave it out for "
                                       "every core\n") and not (tmp_path / "x").exists()
    root = tmp_path / "site"
    _package_set(root, "singles")
    bad = root / "singles03" / "latin.py"
    bad.write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    record = root / "singles03-1.0.dist-info" / "RECORD"
    record.write_text(record.read_text() + "singles03/latin.py,,\n")
    packages = ",".join(f"singles{i:02d}" for i in range(80))
    assert build_main(["--output", str(tmp_path / "c"), "--root", str(root), "--packages", packages, "--vocab-size",
                       "300", "--seq-len", "64", "--quiet", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"left out {bad}: not UTF-8 text" in out and "split adapted: val" in out
    split = json.loads((tmp_path / "c" / "split.json").read_text())
    assert split["left_out_while_listing_files"] == [{"file": str(bad), "reason": "not UTF-8 text (invalid "
                                                      "continuation byte at byte 8)"}]
    assert split["split_rules"]["val"]["adapted"] and split["splits"]["val"]["documents"] > 0
