"""The batch contract, checked against a reference that finds document boundaries by scanning EODs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cplm_megatron.data.batch import collate_packed_samples
from cplm_megatron.data.packing import SamplePacker

EOD = 0


def reference(window: list[int], num_tokens: int, document_masking: bool, eod_mask_loss: bool) -> dict:
    """Per-position loops over one sample; boundaries come from the token values, not the stored starts."""
    seq_len = len(window) - 1
    tokens, labels = window[:-1], window[1:]
    loss = [1.0 if i + 1 < num_tokens else 0.0 for i in range(seq_len)]
    if eod_mask_loss:
        loss = [0.0 if tokens[i] == EOD else m for i, m in enumerate(loss)]
    offsets, documents = [0] * seq_len, [0] * seq_len  # document ids are there with or without masking
    doc, pos = 0, 0
    for i in range(seq_len):
        if i > 0 and tokens[i - 1] == EOD and i - 1 < num_tokens:  # after a real EOD (padding is one segment)
            doc, pos = doc + 1, 0
        offsets[i], documents[i] = pos, doc
        pos += 1
    positions = offsets if document_masking else list(range(seq_len))
    return {"tokens": tokens, "labels": labels, "loss_mask": loss, "position_ids": positions, "document_ids": documents}


def packed_records(seed: int, seq_len: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    packer = SamplePacker(seq_len, EOD, vocab_size=500)
    samples = []
    for length in rng.integers(1, 3 * seq_len, size=40):
        samples += packer.add_document(rng.integers(1, 500, size=int(length)))
    samples += packer.finish()
    assert samples[-1].num_tokens < seq_len + 1, "want a padded last sample in the test data"
    return [{"tokens": s.tokens, "segment_starts": s.segment_starts, "num_tokens": s.num_tokens} for s in samples]


@pytest.mark.parametrize("document_masking", [True, False])
@pytest.mark.parametrize("eod_mask_loss", [True, False])
def test_collate_matches_reference(document_masking: bool, eod_mask_loss: bool) -> None:
    seq_len = 32
    records = packed_records(seed=int(document_masking) * 2 + int(eod_mask_loss), seq_len=seq_len)
    groups = [records[i : i + 4] for i in range(0, len(records) - 4, 4)] + [records[-4:]]  # last: padded
    for group in groups:
        batch = collate_packed_samples(group, eod_id=EOD, document_masking=document_masking, eod_mask_loss=eod_mask_loss)
        assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids", "document_ids"}
        for key, value in batch.items():
            assert value.shape == (4, seq_len), key
            assert value.dtype == (torch.float32 if key == "loss_mask" else torch.int64), key
        for row, record in enumerate(group):
            expected = reference(record["tokens"].tolist(), record["num_tokens"], document_masking, eod_mask_loss)
            for key, value in expected.items():
                assert batch[key][row].tolist() == value, key


def test_padding_and_document_starts_in_a_handmade_sample() -> None:
    # window of seq_len 8: "a b EOD c EOD" then 4 padding EODs (num_tokens = 5)
    record = {"tokens": np.array([7, 8, EOD, 9, EOD, EOD, EOD, EOD, EOD]), "segment_starts": np.array([0, 3, 5]),
              "num_tokens": 5}
    batch = collate_packed_samples([record], eod_id=EOD, document_masking=True, eod_mask_loss=False)
    assert batch["labels"][0].tolist() == [8, EOD, 9, EOD, EOD, EOD, EOD, EOD]
    assert batch["loss_mask"][0].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    assert batch["document_ids"][0].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    masked = collate_packed_samples([record], eod_id=EOD, document_masking=True, eod_mask_loss=True)
    assert masked["loss_mask"][0].tolist() == [1, 1, 0, 1, 0, 0, 0, 0]  # no prediction from an EOD input
