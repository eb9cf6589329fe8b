"""Tokenizer training, loading (ours and foreign HF directories), identity and idempotent rebuilds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cplm_megatron.data.documents import InputError
from cplm_megatron.data.tokenizer import (
    TokenizerError,
    describe_tokenizer,
    eod_id_of,
    load_tokenizer,
    tokenizer_sha256,
)
from cplm_megatron.data.tokenizer_training import train_tokenizer_from_files
from tests.data_fixtures import TinyCorpus


def test_trained_tokenizer_loads_with_autotokenizer_and_roundtrips(tiny_corpus: TinyCorpus) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_corpus.tokenizer_dir))
    assert len(tok) == 512
    assert tok.eos_token == tok.bos_token == tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id == tok.bos_token_id == 0
    text = tiny_corpus.source_files[0].read_text()[:3000]
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) < 0.75 * len(text.encode())  # merges were learned (bytes alone: 1 token per byte)
    config = json.loads((tiny_corpus.tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # loadable by transformers 4.x too
    info = describe_tokenizer(tiny_corpus.tokenizer_dir)
    assert (info.vocab_size, info.eod_id, info.eod_token) == (512, 0, "<|endoftext|>")
    assert info == tiny_corpus.tokenizer


def test_training_is_deterministic_and_idempotent(tmp_path: Path, tiny_corpus: TinyCorpus) -> None:
    files = tiny_corpus.source_files[:5]
    first = train_tokenizer_from_files(files, 300, tmp_path / "a", show_progress=False)
    second = train_tokenizer_from_files(files, 300, tmp_path / "b", show_progress=False)
    assert first.rebuilt and second.rebuilt
    assert first.info.sha256 == second.info.sha256 == tokenizer_sha256(tmp_path / "a")
    mtime = (tmp_path / "a" / "tokenizer.json").stat().st_mtime_ns
    again = train_tokenizer_from_files(files, 300, tmp_path / "a", show_progress=False)
    assert not again.rebuilt and again.info == first.info
    assert (tmp_path / "a" / "tokenizer.json").stat().st_mtime_ns == mtime
    changed = train_tokenizer_from_files(files, 320, tmp_path / "a", show_progress=False)
    assert changed.rebuilt and changed.info.vocab_size == 320
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".a.tmp")) == []


def test_foreign_hf_tokenizer_directory_is_accepted(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "hello": 4, "world": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                 unk_token="<unk>")
    hf.add_tokens(["<extra_0>"])
    hf.save_pretrained(str(tmp_path / "foreign"))
    info = describe_tokenizer(tmp_path / "foreign")
    assert (info.vocab_size, info.eod_id, info.eod_token) == (7, 2, "</s>")
    assert load_tokenizer(tmp_path / "foreign").encode("hello world", add_special_tokens=False) == [4, 5]


def test_unusable_tokenizer_directories(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer directory not found: .*nope"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match=r"empty is not a tokenizer directory .*tools/train_tokenizer\.py"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"cannot load the tokenizer in .*broken"):
        load_tokenizer(tmp_path / "broken")

    class NoEos:
        eos_token_id = None

    with pytest.raises(TokenizerError, match=r"has no EOS token .*eos_token"):
        eod_id_of(NoEos(), tmp_path / "x")


def test_training_on_empty_input_fails_and_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(InputError, match="no text to train on"):
        train_tokenizer_from_files([tmp_path / "empty.txt"], 300, tmp_path / "tok", show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["empty.txt"]
    with pytest.raises(TokenizerError, match="vocab_size=100 is too small"):
        train_tokenizer_from_files([tmp_path / "empty.txt"], 100, tmp_path / "tok", show_progress=False)
