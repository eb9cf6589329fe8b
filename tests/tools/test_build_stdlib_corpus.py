"""tools/build_stdlib_corpus.py (what `make data` runs): layout, split, and idempotent reruns."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cplm_megatron.data.manifest import read_manifest
from tests.data_fixtures import load_tool


def test_capped_build_then_up_to_date(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    tool = load_tool("build_stdlib_corpus")
    args = ["--output", str(tmp_path / "stdlib"), "--vocab-size", "400", "--seq-len", "64", "--max-bytes", "400000",
            "--workers", "2", "--quiet"]
    assert tool.main(args) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "stdlib" / "summary.json").read_text())
    assert out.count("\n") == 1 and out.startswith(f"[stdlib corpus] built: {tmp_path / 'stdlib'} (vocabulary 400; "
                                                   f"train {summary['train']['documents']:,} documents"), out
    assert summary["status"] == "built" and summary["tokenizer"]["vocab_size"] == 400
    train, val = (read_manifest(str(tmp_path / "stdlib" / part)) for part in ("train", "val"))
    assert train.seq_len == val.seq_len == 64 and train.tokenizer == val.tokenizer
    assert not set(train.source_files) & set(val.source_files) and len(val.source_files) >= 1
    assert summary["train"]["samples"] == train.samples and summary["val"]["tokens"] == val.tokens
    dev = read_manifest(str(tmp_path / "stdlib" / "dev"))
    assert not set(dev.source_files) & (set(train.source_files) | set(val.source_files))
    split = json.loads((tmp_path / "stdlib" / "split.json").read_text())
    overlap = split["verbatim_overlap"]["val"]
    assert overlap["window_tokens"] == 32 and overlap["windows"] > 0
    assert summary["verbatim_overlap"]["val"] == overlap["fraction_in_train"] < 0.02
    moved = {m["file"] for m in split["moved_to_train"]}
    assert moved <= set(train.source_files)  # generated / near-duplicate files are training data
    assert tool.main(args) == 0
    assert capsys.readouterr().out.startswith(f"[stdlib corpus] up to date: {tmp_path / 'stdlib'} ")
    assert json.loads((tmp_path / "stdlib" / "summary.json").read_text())["status"] == "up to date"
    assert read_manifest(str(tmp_path / "stdlib" / "train")) == train
