"""prepare_dataset end to end: text -> shards -> loader batches equals direct tokenization; idempotency."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cplm_megatron.data.atomic_output import OutputError
from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.documents import InputError
from cplm_megatron.data.loader import build_val_loader
from cplm_megatron.data.manifest import DatasetError, read_manifest
from cplm_megatron.data.prepare import prepare_dataset
from cplm_megatron.data.tokenizer import load_tokenizer
from tests.data_fixtures import TinyCorpus

pytestmark = pytest.mark.usefixtures("isolated_streaming")


def stream_read_back(dataset_dir: Path, seq_len: int) -> list[int]:
    """The packed token stream as the training loader delivers it (first input + every real label)."""
    cfg = DataConfig(val_streams=[{"path": str(dataset_dir)}])
    stream: list[int] = []
    for batch in build_val_loader(cfg, BatchShape(seq_len, 1, 1), 0, 1):
        if not stream:
            stream.append(int(batch["tokens"][0, 0]))
        stream += batch["labels"][0][batch["loss_mask"][0] == 1].tolist()
    return stream


def test_roundtrip_equals_direct_tokenization(tiny_corpus: TinyCorpus) -> None:
    tokenizer = load_tokenizer(tiny_corpus.tokenizer_dir)
    expected: list[int] = []
    for file in tiny_corpus.source_files:
        text = file.read_text(encoding="utf-8")
        if text.strip():
            expected += tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert stream_read_back(tiny_corpus.dataset_dir, tiny_corpus.seq_len) == expected
    manifest = read_manifest(str(tiny_corpus.dataset_dir))
    assert manifest.tokens == len(expected)
    assert manifest.samples == -(-(len(expected) - 1) // tiny_corpus.seq_len)
    assert manifest.source_files == [str(f) for f in tiny_corpus.source_files]
    assert manifest.tokenizer == tiny_corpus.tokenizer
    assert len(list(tiny_corpus.dataset_dir.glob("shard.*.mds.zstd"))) > 1


def test_worker_count_does_not_change_the_output(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    result = prepare_dataset(tiny_corpus.source_files, tiny_corpus.tokenizer_dir, tmp_path / "w2",
                             seq_len=tiny_corpus.seq_len, workers=2, show_progress=False, shard_size_limit=1 << 16)
    single = tiny_corpus.dataset_dir
    assert result.manifest.fingerprint == read_manifest(str(single)).fingerprint
    for name in ["index.json", *sorted(p.name for p in single.glob("shard.*.mds.zstd"))]:
        assert (tmp_path / "w2" / name).read_bytes() == (single / name).read_bytes(), name


def test_rerun_is_a_no_op_and_changes_rebuild(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    files = [tmp_path / "a.txt", tmp_path / "b.jsonl"]
    files[0].write_text("def f():\n    return 1\n")
    files[1].write_text(json.dumps({"text": "x = 1"}) + "\n" + json.dumps({"text": "y = 2"}) + "\n")
    out = tmp_path / "out"
    first = prepare_dataset(files, tiny_corpus.tokenizer_dir, out, seq_len=8, show_progress=False)
    assert first.rebuilt and first.manifest.documents == 3
    stamp = (out / "manifest.json").stat().st_mtime_ns
    again = prepare_dataset(files, tiny_corpus.tokenizer_dir, out, seq_len=8, show_progress=False)
    assert not again.rebuilt and (out / "manifest.json").stat().st_mtime_ns == stamp
    other_len = prepare_dataset(files, tiny_corpus.tokenizer_dir, out, seq_len=4, show_progress=False)
    assert other_len.rebuilt and other_len.manifest.seq_len == 4
    files[0].write_text("def g():\n    return 22\n")
    assert prepare_dataset(files, tiny_corpus.tokenizer_dir, out, seq_len=4, show_progress=False).rebuilt
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "a.txt", "b.jsonl", "out"]


def test_failed_build_leaves_no_dataset_and_keeps_the_previous_one(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    good = tmp_path / "good.txt"
    good.write_text("print('hello')\n" * 50)
    bad = tmp_path / "late_error.jsonl"
    bad.write_text(json.dumps({"text": "fine"}) + "\n{broken\n")
    with pytest.raises(InputError, match=r"late_error\.jsonl:2: invalid JSON"):
        prepare_dataset([good, bad], tiny_corpus.tokenizer_dir, tmp_path / "fresh", seq_len=8, show_progress=False)
    assert not (tmp_path / "fresh").exists()
    previous = prepare_dataset([good], tiny_corpus.tokenizer_dir, tmp_path / "kept", seq_len=8, show_progress=False)
    with pytest.raises(InputError):
        prepare_dataset([good, bad], tiny_corpus.tokenizer_dir, tmp_path / "kept", seq_len=8, show_progress=False)
    assert read_manifest(str(tmp_path / "kept")) == previous.manifest
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_special_token_text_never_becomes_a_document_boundary(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    docs = [tmp_path / "d1.txt", tmp_path / "d2.txt"]
    for doc in docs:
        doc.write_text("before <|endoftext|> after\n")
    result = prepare_dataset(docs, tiny_corpus.tokenizer_dir, tmp_path / "o", seq_len=64, show_progress=False)
    stream = stream_read_back(tmp_path / "o", 64)
    assert stream.count(tiny_corpus.tokenizer.eod_id) == result.manifest.documents == 2


def test_empty_input_and_foreign_output_directory(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(DatasetError, match="holds no documents"):
        prepare_dataset([tmp_path / "empty.txt"], tiny_corpus.tokenizer_dir, tmp_path / "o", seq_len=8,
                        show_progress=False)
    assert not (tmp_path / "o").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    (tmp_path / "in.txt").write_text("x = 1\n")
    with pytest.raises(OutputError, match=r"mine is not empty and was not written by this tool"):
        prepare_dataset([tmp_path / "in.txt"], tiny_corpus.tokenizer_dir, tmp_path / "mine", seq_len=8,
                        show_progress=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"
