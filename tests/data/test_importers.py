"""The data tools' other inputs: a `datasets` save_to_disk folder (read against the datasets library's own
reader) and a Megatron indexed dataset (written by megatron-core's IndexedDatasetBuilder, read against its
IndexedDataset); and their bad inputs, each one clear InputError."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cplm_megatron.data.documents import InputError
from cplm_megatron.data.importers import MegatronIndexed, SavedHFDataset, plan_sources

VOCAB, EOD = 512, 0


def megatron_dataset(prefix: Path, docs: list[list[list[int]]], dtype=np.uint16) -> Path:
    """Write `docs` (each a list of sequences of ids; the last sequence ends with EOD, as preprocess_data.py
    --append-eod writes it) with megatron-core's builder."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for sequences in docs:
        builder.add_document(torch.tensor([t for s in sequences for t in s]), [len(s) for s in sequences])
    builder.finalize(f"{prefix}.idx")
    return prefix


def random_documents(seed: int, count: int = 40) -> list[list[list[int]]]:
    """Documents of 1-3 sequences of 1-60 ids in 1..VOCAB-1, EOD-terminated; one holds an EOD inside."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for _ in range(count):
        sequences = [torch.randint(1, VOCAB, (int(torch.randint(1, 61, (1,), generator=g)),), generator=g).tolist()
                     for _ in range(int(torch.randint(1, 4, (1,), generator=g)))]
        sequences[-1].append(EOD)
        docs.append(sequences)
    docs[3][0][1:1] = [EOD]  # two texts joined into one Megatron document: two documents for the packer
    return docs


@pytest.mark.mcore
@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_megatron_documents_are_megatron_cores_split_at_eod(tmp_path: Path, dtype) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = megatron_dataset(tmp_path / "corpus_text_document", random_documents(1), dtype)
    reference = IndexedDataset(str(prefix))
    expected = []
    for start, end in zip(reference.document_indices[:-1], reference.document_indices[1:]):
        ids = np.concatenate([reference[i] for i in range(start, end)])
        expected += [piece[piece != EOD] for piece in np.split(ids, np.flatnonzero(ids == EOD) + 1) if
                     len(piece[piece != EOD])]
    for name in (str(prefix), f"{prefix}.bin", f"{prefix}.idx"):  # a prefix, as Megatron's --data-path, or a file
        [source] = plan_sources([name])
        assert isinstance(source, MegatronIndexed) and source.dtype == np.dtype(dtype)
        got = list(source.token_documents(VOCAB, EOD))
        assert len(got) == len(expected) == 41 and all(np.array_equal(g, e) for g, e in zip(got, expected))
        assert source.describe() == {"kind": "megatron_indexed", "prefix": str(prefix), "dtype": np.dtype(dtype).name,
                                     "sequences": len(reference.index), "documents": 40}
    with pytest.raises(InputError, match=r"token id \d+ is outside the --tokenizer's vocabulary \(256 tokens\): the "
                                         r"ids were made with another tokenizer"):
        list(plan_sources([str(prefix)])[0].token_documents(256, EOD))


@pytest.mark.mcore
def test_a_damaged_or_incomplete_megatron_dataset_is_named(tmp_path: Path) -> None:
    prefix = megatron_dataset(tmp_path / "c", random_documents(2))
    bin_, idx = Path(f"{prefix}.bin"), Path(f"{prefix}.idx")
    data = bin_.read_bytes()
    bin_.write_bytes(data[:-2])
    with pytest.raises(InputError, match=r"c\.bin is [\d,]+ bytes where its index describes [\d,]+: the pair does "
                                         r"not match"):
        plan_sources([str(prefix)])
    bin_.unlink()
    with pytest.raises(InputError, match=r"needs c\.idx and c\.bin side by side; .*c\.bin does not exist"):
        plan_sources([str(idx)])
    bin_.write_bytes(data)
    idx.write_bytes(b"NOTMEGA" + idx.read_bytes()[7:])
    with pytest.raises(InputError, match="is not a Megatron index file"):
        plan_sources([str(prefix)])


def saved_dataset(path: Path, rows: dict, shards: int = 2) -> Path:
    import datasets

    dataset = datasets.Dataset.from_dict(rows).shuffle(seed=3).select(range(len(next(iter(rows.values()))) - 2))
    dataset.save_to_disk(str(path), num_shards=shards)
    return path


def test_a_saved_datasets_folder_reads_as_the_datasets_library_does(tmp_path: Path) -> None:
    """Rows in the saved order (a shuffled selection: the saved Arrow files hold the rows as selected), every shard
    in state.json's order; empty and missing texts skipped and counted; other inputs beside it stay text files."""
    import datasets

    texts = [f"text number {i}\n" * (i % 5) for i in range(30)]  # i % 5 == 0: empty
    texts[7] = None
    path = saved_dataset(tmp_path / "saved", {"content": texts, "n": list(range(30))}, shards=3)
    (tmp_path / "more.txt").write_text("plain text")
    source, files = plan_sources([str(path), str(tmp_path / "more.txt")], text_field="content")
    assert isinstance(source, SavedHFDataset) and len(source.arrow_files) == 3
    expected = [t for t in datasets.load_from_disk(str(path))["content"] if t and t.strip()]
    assert list(source.documents()) == expected
    assert source.stats.documents == len(expected) and source.stats.empty_skipped == 28 - len(expected) > 0
    assert [f.name for f in source.files] == ["state.json", "dataset_info.json", *(f"data-0000{i}-of-00003.arrow"
                                                                                   for i in range(3))]
    assert list(files.documents()) == ["plain text"]
    assert plan_sources([str(tmp_path / "more.txt")]) is None  # only text inputs: the tools' usual path


def test_saved_dataset_errors_name_the_fix(tmp_path: Path) -> None:
    import datasets

    path = saved_dataset(tmp_path / "saved", {"content": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]})
    with pytest.raises(InputError, match=r"saved: no column 'text' \(columns: \['content', 'n'\]\); choose the "
                                         r"column with --text-field"):
        list(plan_sources([str(path)])[0].documents())
    with pytest.raises(InputError, match="column 'n' holds int values, not text"):
        list(plan_sources([str(path)], text_field="n")[0].documents())
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]}),
                                   "test": datasets.Dataset.from_dict({"text": ["y"]})})
    splits.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(InputError, match=r"is a datasets DatasetDict with splits train, test: pass one split's "
                                         r"folder, e\.g\. .*dict/train"):
        plan_sources([str(tmp_path / "dict")])
    state = json.loads((path / "state.json").read_text())
    (path / state["_data_files"][1]["filename"]).unlink()
    with pytest.raises(InputError, match=r"data-00001-of-00002\.arrow \(listed in state\.json\) does not exist"):
        plan_sources([str(path)], text_field="content")
