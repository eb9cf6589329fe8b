"""Packing documents into overlapping seq_len+1 windows, checked against a direct construction."""
from __future__ import annotations

import numpy as np
import pytest

from cplm_megatron.data.packing import SamplePacker, token_dtype_for_vocab

EOD = 0


def reference_windows(docs: list[list[int]], seq_len: int) -> list[tuple[list[int], list[int], int]]:
    """(tokens, segment_starts, num_tokens) per sample, built from the whole stream at once."""
    stream, doc_start = [], set()
    for doc in docs:
        doc_start.add(len(stream))
        stream += doc + [EOD]
    out = []
    for begin in range(0, len(stream) - 1, seq_len):
        window = stream[begin : begin + seq_len + 1]
        real = len(window)
        starts = [p for p in range(real) if p == 0 or begin + p in doc_start]
        if real < seq_len + 1:
            starts.append(real)
        out.append((window + [EOD] * (seq_len + 1 - real), starts, real))
    return out


def pack(docs: list[list[int]], seq_len: int, vocab: int = 1000) -> tuple[SamplePacker, list]:
    packer = SamplePacker(seq_len, EOD, vocab)
    samples = [s for d in docs for s in packer.add_document(d)] + packer.finish()
    return packer, samples


@pytest.mark.parametrize("seq_len", [1, 2, 7, 16])
def test_matches_reference_on_random_documents(seq_len: int) -> None:
    rng = np.random.default_rng(seq_len)
    docs = [rng.integers(1, 1000, size=int(n)).tolist() for n in rng.integers(0, 40, size=60)]
    packer, samples = pack(docs, seq_len)
    expected = reference_windows(docs, seq_len)
    assert len(samples) == len(expected)
    for sample, (tokens, starts, real) in zip(samples, expected, strict=True):
        assert sample.tokens.tolist() == tokens
        assert sample.segment_starts.tolist() == starts
        assert sample.num_tokens == real
        assert sample.tokens.dtype == np.uint16 and sample.segment_starts.dtype == np.int32
    total = sum(len(d) + 1 for d in docs)
    assert (packer.documents, packer.tokens, packer.samples) == (len(docs), total, len(expected))
    assert packer.padding_tokens == len(expected) * (seq_len + 1) - sum(e[2] for e in expected)


def test_every_token_after_the_first_is_a_label_exactly_once() -> None:
    docs = [list(range(1, 30)), list(range(30, 31)), list(range(31, 100))]
    _, samples = pack(docs, seq_len=8)
    labels = [int(t) for s in samples for t in s.tokens[1 : s.num_tokens]]
    stream = [t for d in docs for t in d + [EOD]]
    assert labels == stream[1:]


def test_exact_fit_needs_no_padding_and_leftover_is_padded() -> None:
    # 3 docs of 4 tokens + EOD = 15 tokens = 2 full windows of seq_len 7 (overlap 1): no padding.
    packer, samples = pack([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], seq_len=7)
    assert [s.num_tokens for s in samples] == [8, 8] and packer.padding_tokens == 0
    packer, samples = pack([[1, 2, 3, 4], [5]], seq_len=7)
    assert len(samples) == 1 and samples[0].num_tokens == 7
    assert samples[0].tokens.tolist() == [1, 2, 3, 4, EOD, 5, EOD, EOD]
    assert samples[0].segment_starts.tolist() == [0, 5, 7]  # doc 1 starts at 5; padding at 7


def test_one_long_document_is_linear_and_exact() -> None:
    doc = (np.arange(200_000) % 999 + 1).tolist()
    _, samples = pack([doc], seq_len=128)
    assert len(samples) == -(-200_000 // 128)
    assert all(s.segment_starts.tolist() == [0] for s in samples[:-1])
    np.testing.assert_array_equal(samples[5].tokens, np.asarray(doc[640:769], dtype=np.uint16))


def test_bad_ids_and_dtypes() -> None:
    packer = SamplePacker(4, EOD, vocab_size=100)
    with pytest.raises(ValueError, match="token id 100 is outside the vocabulary"):
        packer.add_document([1, 100])
    with pytest.raises(ValueError, match="token id -1"):
        packer.add_document([-1])
    with pytest.raises(ValueError, match="eod_id=7 is outside"):
        SamplePacker(4, 7, vocab_size=5)
    assert token_dtype_for_vocab(65536) == np.uint16
    assert token_dtype_for_vocab(65537) == np.uint32
