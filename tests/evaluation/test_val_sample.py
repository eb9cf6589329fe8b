"""The samples the val (and cache) task scores: by default a sample spread evenly across the validation set, with
each position's document id counted over the whole set; every sample with val_all."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cplm_megatron.evaluation.options import DEFAULT_LIMITS, EvalOptions
from cplm_megatron.evaluation.tasks import val
from tests.data_fixtures import synthetic_tokenizer, write_synthetic_dataset

VOCAB, SEQ_LEN, EOD = 512, 64, 0


@pytest.fixture(scope="module")
def long_documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 documents of 100-300 tokens packed into 64-token samples: most documents span several samples."""
    g = torch.Generator().manual_seed(3)
    docs = [torch.randint(1, VOCAB, (int(torch.randint(100, 301, (1,), generator=g)),), generator=g).tolist()
            for _ in range(30)]
    path = tmp_path_factory.mktemp("long-docs")
    write_synthetic_dataset(path, docs, SEQ_LEN, synthetic_tokenizer(VOCAB, eod_id=EOD))
    return path


def whole_pass(path: Path) -> tuple[torch.Tensor, list[dict]]:
    """Every sample's tokens [N, S] in order (the loader's one unshuffled pass) and its batches."""
    batches = list(val.open_val_loader([str(path)], 4, True, VOCAB))
    return torch.cat([b["tokens"] for b in batches]), batches


def test_spread_indices():
    assert val.spread_indices(10, None) == list(range(10)) == val.spread_indices(10, 10) == val.spread_indices(10, 99)
    assert val.spread_indices(10, 4) == [0, 2, 5, 7]
    picked = val.spread_indices(1000, 256)
    assert len(set(picked)) == 256 and picked[0] == 0 and picked[-1] >= 1000 - 4  # to the end, not a prefix
    assert max(np.diff(picked)) - min(np.diff(picked)) <= 1
    assert DEFAULT_LIMITS["val"] == 256


def test_the_default_sample_is_spread_and_keeps_documents_whole(long_documents: Path, isolated_streaming):
    """limit 30 of the set's samples: the rows at the spread indices, re-batched by batch_size, each position's
    document = the EODs before it in the whole stream (so a document's pieces in two sampled rows stay one)."""
    tokens, _ = whole_pass(long_documents)
    available = tokens.shape[0]
    loader = val.open_val_loader([str(long_documents)], 4, True, VOCAB)
    sample = val.val_sample(loader, EvalOptions(batch_size=4, limit=30))
    chosen = val.spread_indices(available, 30)
    assert (sample.sequences, sample.available) == (30, available) and available > 2 * 30
    assert [b["tokens"].shape[0] for b in sample.batches] == [4] * 7 + [2]
    assert torch.equal(torch.cat([b["tokens"] for b in sample.batches]), tokens[chosen])
    stream = tokens.flatten().numpy()
    eods_before = np.cumsum(stream == EOD) - (stream == EOD)  # an EOD belongs to the document it ends
    expected = torch.from_numpy(eods_before.reshape(tokens.shape)[chosen])
    documents = torch.cat(sample.documents)
    assert torch.equal(documents, expected)
    gaps = np.diff(chosen)
    assert any(documents[i, -1] == documents[i + 1, 0] for i in range(29) if gaps[i] > 1)  # one document, two rows
    assert val.sample_note(30, available).startswith(f"30 of {available:,} validation sequences, spread evenly")


def test_val_all_is_every_batch_of_the_loader(long_documents: Path, isolated_streaming):
    _, batches = whole_pass(long_documents)
    loader = val.open_val_loader([str(long_documents)], 4, True, VOCAB)
    sample = val.val_sample(loader, EvalOptions(batch_size=4, limit=2, val_all=True))
    assert len(sample.batches) == len(batches)
    for got, want in zip(sample.batches, batches):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert val.sample_note(sample.sequences, sample.available).startswith("every one of the")
