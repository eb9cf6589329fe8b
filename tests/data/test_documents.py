"""Reading corpora: formats, compression, document splitting, deterministic order, clear errors."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstd

from cplm_megatron.data.documents import DocumentReader, InputError, expand_inputs


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_formats_and_compression_give_the_same_documents(tmp_path: Path) -> None:
    docs = ["first document\nwith two lines", "second — non-ASCII ✓", "third"]
    jsonl = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": docs, "n": [1, 2, 3]}), parquet)
    files = [
        _write(tmp_path / "a.jsonl", jsonl),
        _write(tmp_path / "b.jsonl.gz", gzip.compress(jsonl)),
        _write(tmp_path / "d.jsonl.zst", zstd.compress(jsonl)),
        parquet,
    ]
    for file in files:
        assert list(DocumentReader([file])) == docs, file.name
    text = "\n\n".join(docs).encode()
    assert list(DocumentReader([_write(tmp_path / "t.txt.zst", zstd.compress(text))])) == ["\n\n".join(docs)]
    assert list(DocumentReader([_write(tmp_path / "t.py.gz", gzip.compress(text))], split_by="paragraph")) == docs


def test_split_modes_and_empty_documents(tmp_path: Path) -> None:
    file = _write(tmp_path / "x.txt", b"alpha\n\n  \nbeta line\ngamma\n\n\ndelta")
    reader = DocumentReader([file], split_by="line")
    assert list(reader) == ["alpha", "beta line", "gamma", "delta"]
    assert reader.stats.empty_skipped == 4  # "", "  ", "", ""
    assert list(DocumentReader([file], split_by="paragraph")) == ["alpha", "beta line\ngamma", "delta"]
    empty = _write(tmp_path / "empty.txt", b"   \n")
    reader = DocumentReader([empty])
    assert list(reader) == [] and reader.stats.documents == 0 and reader.stats.empty_skipped == 1


def test_a_few_invalid_utf8_bytes_are_replaced_and_counted(tmp_path: Path) -> None:
    text = "mostly fine text, " * 20  # 360 bytes, 2 of them bad: 0.6% < the 10% default
    reader = DocumentReader([_write(tmp_path / "bad.txt", text.encode() + b"ok \xff\xfe bytes")])
    assert list(reader) == [text + "ok \ufffd\ufffd bytes"]
    assert reader.stats.decode_errors == 1


def test_binary_input_named_txt_is_refused_naming_the_share_and_the_flag(tmp_path: Path) -> None:
    binary = _write(tmp_path / "model.txt", bytes(range(256)) * 40)  # 128 invalid + 1 NUL byte per 256: 50%
    with pytest.raises(InputError, match=r"model\.txt: 50% of its 10,240 bytes are not text \(invalid UTF-8 or NUL\)"
                                         r".*--max-invalid-utf8 0\.51 accepts it"):
        list(DocumentReader([binary]))
    utf16 = _write(tmp_path / "utf16.txt", "plain ASCII saved as UTF-16".encode("utf-16-le"))  # every 2nd byte NUL
    with pytest.raises(InputError, match=r"utf16\.txt: 50% .*another encoding \(UTF-16, Latin-1\)"):
        list(DocumentReader([utf16]))
    accepted = DocumentReader([binary], max_invalid_fraction=0.51)  # the override
    assert len(list(accepted)) == 1 and accepted.stats.decode_errors == 1


def test_invalid_utf8_in_jsonl_names_the_line(tmp_path: Path) -> None:
    data = b'{"text": "fine"}\n' * 30 + b'{"text": "caf\xe9"}\n'
    with pytest.raises(InputError, match=r"c\.jsonl:31: not valid UTF-8"):
        list(DocumentReader([_write(tmp_path / "c.jsonl", data)]))


def test_directories_expand_sorted_and_skip_unsupported_files(tmp_path: Path) -> None:
    for name in ("b/2.txt", "a/1.py", "b/1.jsonl", "a/notes.bin", "a/img.png", "c/x.parquet.gz"):
        _write(tmp_path / "corpus" / name, b"x")
    single = _write(tmp_path / "z.md", b"x")
    files = expand_inputs([single, tmp_path / "corpus", single])
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["z.md", "corpus/a/1.py", "corpus/b/1.jsonl",
                                                                   "corpus/b/2.txt"]


@pytest.mark.parametrize(
    ("name", "content", "field", "message"),
    [
        ("r.jsonl", b'{"text": "ok"}\n{"body": "no text"}\n', "text", r"r\.jsonl:2: record has no 'text' field"),
        ("r.jsonl", b'{"text": "ok"}\n{not json\n', "text", r"r\.jsonl:2: invalid JSON"),
        ("r.jsonl", b'{"text": 3}\n', "text", r"r\.jsonl:1: field 'text' is int"),
        ("r.jsonl.gz", b"not gzip at all", "text", r"cannot read .*r\.jsonl\.gz.*corrupt or truncated"),
        ("r.txt.zst", b"not zstd", "text", r"cannot read .*r\.txt\.zst"),
    ],
)
def test_bad_records_name_the_file_and_line(tmp_path: Path, name: str, content: bytes, field: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        list(DocumentReader([_write(tmp_path / name, content)], text_field=field))


def test_parquet_without_the_column_names_the_columns(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(InputError, match=r"p\.parquet: no column 'text' \(columns: \['content'\]\)"):
        list(DocumentReader([tmp_path / "p.parquet"]))


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no input paths"):
        expand_inputs([])
    with pytest.raises(InputError, match=r"does not exist: .*missing\.txt"):
        expand_inputs([tmp_path / "missing.txt"])
    with pytest.raises(InputError, match=r"unsupported input file .*data\.bin"):
        expand_inputs([_write(tmp_path / "data.bin", b"x")])
    (tmp_path / "only_bins").mkdir()
    _write(tmp_path / "only_bins" / "x.bin", b"x")
    with pytest.raises(InputError, match=r"only_bins holds no supported files"):
        expand_inputs([tmp_path / "only_bins"])
    with pytest.raises(InputError, match="split_by='words'"):
        DocumentReader([], split_by="words")
