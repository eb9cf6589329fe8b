"""Preparing a dataset as N parts and merging them: the same documents as one run, in an order stable for
a given N, read by the project's loader; part reruns skip intact parts; lazy glob / @LIST / directory inputs."""
from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cplm_megatron.data import inputs as inputs_module
from cplm_megatron.data.documents import InputError, expand_inputs
from cplm_megatron.data.inputs import iter_input_files, parse_part, part_files, part_of, sample_files
from cplm_megatron.data.manifest import DatasetError, read_manifest
from cplm_megatron.data.parts import merge_parts, merged_index_shards
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.stdlib_corpus import stdlib_root
from cplm_megatron.data.tokenizer import load_tokenizer
from tests.data.packed_docs import documents_of, loader_samples
from tests.data_fixtures import TinyCorpus

pytestmark = pytest.mark.usefixtures("isolated_streaming")
PARTS = 3


def build_parts(inputs: list, tiny: TinyCorpus, output: Path, parts: int = PARTS, **kwargs) -> list:
    return [prepare_dataset(inputs, tiny.tokenizer_dir, output, seq_len=tiny.seq_len, workers=1, show_progress=False,
                            shard_size_limit=1 << 15, part=(i, parts), **kwargs) for i in range(1, parts + 1)]


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory, tiny_corpus: TinyCorpus) -> Path:
    """The tiny corpus's files prepared as 3 parts and merged (the single run is tiny_corpus.dataset_dir)."""
    output = tmp_path_factory.mktemp("merged") / "ds"
    build_parts([str(f) for f in tiny_corpus.source_files], tiny_corpus, output)
    merge_parts(output)
    return output


def test_merged_parts_hold_exactly_the_single_run_documents(merged: Path, tiny_corpus: TinyCorpus) -> None:
    eod = tiny_corpus.tokenizer.eod_id
    manifest = read_manifest(str(merged))
    single = read_manifest(str(tiny_corpus.dataset_dir))
    part_samples = [p["samples"] for p in manifest.settings["parts"]]
    assert len(part_samples) == PARTS and all(part_samples)
    merged_docs = documents_of(loader_samples(merged, tiny_corpus.seq_len), part_samples, eod)
    single_docs = documents_of(loader_samples(tiny_corpus.dataset_dir, tiny_corpus.seq_len), [single.samples], eod)
    assert Counter(merged_docs) == Counter(single_docs) and len(merged_docs) == len(single_docs)
    assert (manifest.documents, manifest.tokens) == (single.documents, single.tokens)
    assert manifest.samples == sum(part_samples) and manifest.tokenizer == single.tokenizer
    assert sorted(manifest.source_files) == sorted(single.source_files)
    # the order: part 1's files sorted by path, then part 2's, ...; each file's document as the single run has it
    tokenizer = load_tokenizer(tiny_corpus.tokenizer_dir)
    expected = []
    for i in range(1, PARTS + 1):
        for file in sorted(f for f in tiny_corpus.source_files if part_of(f, PARTS) == i):
            text = file.read_text(encoding="utf-8")
            if text.strip():
                expected.append(tuple(tokenizer.encode(text, add_special_tokens=False) + [eod]))
    assert merged_docs == expected
    # one dataset: the merged index names every part's shards, in part order
    shards = merged_index_shards(merged)
    assert [s.split("/")[0] for s in shards] == sorted(s.split("/")[0] for s in shards)
    assert {s.split("/")[0] for s in shards} == {f"part-0000{i}-of-00003" for i in (1, 2, 3)}


def test_part_rerun_skips_intact_parts_and_rebuilds_a_damaged_one(merged: Path, tiny_corpus: TinyCorpus,
                                                                   tmp_path: Path) -> None:
    output = tmp_path / "ds"
    shutil.copytree(merged, output)
    files = [str(f) for f in tiny_corpus.source_files]
    written = lambda: {p: p.read_bytes() for p in output.rglob("*") if p.is_file() and p.suffix != ".mds"}  # noqa: E731
    before = written()  # (the loader decompresses shards to *.mds beside them)
    reruns = build_parts(files, tiny_corpus, output)
    assert [r.rebuilt for r in reruns] == [False] * PARTS
    part2 = output / "part-00002-of-00003"
    shard = sorted(part2.glob("shard.*.mds.zstd"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # a killed copy, a bad disk
    with pytest.raises(DatasetError, match="shard corrupt"):
        merge_parts(output)  # the merge refuses a damaged part
    mtimes = {p: p.stat().st_mtime_ns for p in output.glob("part-0000[13]-of-00003/*")}
    results = build_parts(files, tiny_corpus, output)
    assert [r.rebuilt for r in results] == [False, True, False] and results[1].damage
    assert {p: p.stat().st_mtime_ns for p in output.glob("part-0000[13]-of-00003/*")} == mtimes
    assert merge_parts(output).rebuilt is False  # the rebuilt part is identical: the merge is up to date
    assert written() == before


def test_order_is_stable_under_relisting(tiny_corpus: TinyCorpus, tmp_path: Path) -> None:
    """Directory, reversed @LIST file and glob pattern give the same parts and the same merged dataset."""
    root = tmp_path / "corpus"
    for k, file in enumerate(tiny_corpus.source_files[:24]):
        target = root / ("a" if k % 2 else "b-c") / f"sub{k % 3}" / file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file, target)
    listing = sorted(str(p) for p in root.rglob("*.py"))
    list_file = tmp_path / "files.txt"
    list_file.write_text("# corpus\n\n" + "\n".join(reversed(listing)) + "\n")
    pattern = str(root / "**" / "*.py")
    for parts in (1, 3, 5):
        expected = [part_files([root], i, parts) for i in range(1, parts + 1)]
        assert sorted(f for part in expected for f in part) == [Path(p) for p in listing]
        for spec in ([f"@{list_file}"], [pattern], [str(root / "b-c"), str(root / "a")]):
            assert [part_files(spec, i, parts) for i in range(1, parts + 1)] == expected, (spec, parts)
    digests = []
    for k, spec in enumerate(([str(root)], [f"@{list_file}"])):
        output = tmp_path / f"out{k}"
        build_parts(spec, tiny_corpus, output)
        merge_parts(output, expected_parts=PARTS)
        digests.append({p.relative_to(output): p.read_bytes() for p in output.rglob("shard.*")})
        digests[-1]["index"] = (output / "index.json").read_bytes()
    assert digests[0] == digests[1]


def test_empty_parts_merge(tiny_corpus: TinyCorpus, tmp_path: Path) -> None:
    files = [str(f) for f in tiny_corpus.source_files[:2]]
    output = tmp_path / "ds"
    results = build_parts(files, tiny_corpus, output, parts=6)
    assert sum(r.manifest.documents == 0 for r in results) >= 4
    merged = merge_parts(output)
    assert merged.manifest.documents == 2 and len(merged.manifest.settings["parts"]) == 6
    assert len(loader_samples(output, tiny_corpus.seq_len)) == merged.manifest.samples


def test_merge_refuses_missing_mixed_or_foreign_parts(tiny_corpus: TinyCorpus, tmp_path: Path) -> None:
    files = [str(f) for f in tiny_corpus.source_files[:6]]
    output = tmp_path / "ds"
    with pytest.raises(DatasetError, match="does not exist"):
        merge_parts(output)
    output.mkdir()
    with pytest.raises(DatasetError, match="no part-IIIII-of-NNNNN"):
        merge_parts(output)
    prepare_dataset(files, tiny_corpus.tokenizer_dir, output, seq_len=tiny_corpus.seq_len, show_progress=False,
                    part=(1, 2))
    with pytest.raises(DatasetError, match=r"part 2/2 is missing .* never ran\); run tools/prepare_data.py --part 2/2"):
        merge_parts(output)
    with pytest.raises(DatasetError, match="N = 2, not the 3"):
        merge_parts(output, expected_parts=3)
    prepare_dataset(files[:3], tiny_corpus.tokenizer_dir, output, seq_len=tiny_corpus.seq_len, show_progress=False,
                    part=(2, 2))
    with pytest.raises(DatasetError, match="part 2/2 was prepared from other inputs"):
        merge_parts(output)
    prepare_dataset(files, tiny_corpus.tokenizer_dir, output, seq_len=tiny_corpus.seq_len * 2, show_progress=False,
                    part=(2, 2))
    with pytest.raises(DatasetError, match="another tokenizer or other settings"):
        merge_parts(output)
    prepare_dataset(files, tiny_corpus.tokenizer_dir, output, seq_len=tiny_corpus.seq_len, show_progress=False,
                    part=(1, 3))
    with pytest.raises(DatasetError, match="parts of different splits"):
        merge_parts(output)
    assert not (output / "manifest.json").exists() and not (output / "index.json").exists()


def test_merge_refuses_parts_that_saw_another_listing(tiny_corpus: TinyCorpus, tmp_path: Path) -> None:
    """Files added between the parts' runs (or nodes seeing other paths): the parts' listings differ, so a merge
    would lose or double documents. Rerunning the other part (its own files unchanged: not rebuilt) fixes it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for file in tiny_corpus.source_files[:6]:
        shutil.copy(file, corpus / file.name)
    output = tmp_path / "ds"
    kwargs = dict(seq_len=tiny_corpus.seq_len, show_progress=False)
    first = prepare_dataset([corpus], tiny_corpus.tokenizer_dir, output, part=(1, 2), **kwargs)
    added = next(corpus / f"new{k}.py" for k in range(100) if part_of(corpus / f"new{k}.py", 2) == 2)
    added.write_text("x = 1\n")
    prepare_dataset([corpus], tiny_corpus.tokenizer_dir, output, part=(2, 2), **kwargs)
    with pytest.raises(DatasetError, match=r"part 2/2 listed 7 input files, part 1 listed 6 .* inputs changed"):
        merge_parts(output)
    again = prepare_dataset([corpus], tiny_corpus.tokenizer_dir, output, part=(1, 2), **kwargs)
    assert not again.rebuilt and again.manifest.fingerprint == first.manifest.fingerprint
    assert merge_parts(output).manifest.documents == first.manifest.documents + 1 + sum(
        1 for f in corpus.iterdir() if f != added and part_of(f, 2) == 2 and f.read_text().strip())


def test_listing_is_lazy_and_matches_expand_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    root = stdlib_root()
    targets = [root / "json", root / "email", root / "string.py"]
    assert list(iter_input_files(targets)) == expand_inputs(targets)
    scanned: list[str] = []
    real_scandir = os.scandir

    def recording_scandir(path):
        scanned.append(str(path))
        return real_scandir(path)

    monkeypatch.setattr(inputs_module.os, "scandir", recording_scandir)
    first = next(iter_input_files([root]))
    # the first file comes after listing only the directories on its way, not the tree
    assert len(scanned) <= len(first.relative_to(root).parts) and first == expand_inputs([root / first.relative_to(
        root).parts[0]])[0]


def test_input_errors_name_the_input(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(InputError, match=r"pattern .*\*\.jsonl' matches no supported files"):
        list(iter_input_files([str(tmp_path / "*.jsonl")]))
    (tmp_path / "list.txt").write_text("a.txt\nmissing.txt\n")
    with pytest.raises(InputError, match=r"does not exist: .*missing.txt \(listed in .*list.txt\)"):
        list(iter_input_files([f"@{tmp_path / 'list.txt'}"]))
    with pytest.raises(InputError, match="cannot read input list"):
        list(iter_input_files([f"@{tmp_path / 'nope.txt'}"]))
    for bad in ("3", "0/3", "4/3", "a/b", "1/0"):
        with pytest.raises(InputError, match="--part"):
            parse_part(bad)
    assert parse_part(" 2/8 ") == (2, 8)


def test_sample_files_is_a_bounded_spread_sample() -> None:
    root = stdlib_root()
    every = list(iter_input_files([root / "email", root / "json"]))
    chosen, digest = sample_files([root / "email", root / "json"], 5)
    assert len(chosen) == 5 and set(chosen) <= set(every)
    again, digest2 = sample_files([root / "json", root / "email"], 5)  # re-listed: same sample
    assert again == chosen and digest == digest2
    assert sample_files([root / "email"], 5)[1] != digest  # another file set, another digest
    assert sample_files([root / "email", root / "json"], 10_000)[0] == sorted(
        every, key=lambda f: inputs_module.hashlib.sha256(str(f).encode()).digest()[:8])
