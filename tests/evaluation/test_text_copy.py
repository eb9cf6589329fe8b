"""Held-out text repeated once (evaluation/text_copy.py): which spans, which tokens are scored, the tallies."""
from __future__ import annotations

import torch

from cplm_megatron.evaluation.text_copy import TextCopyTally, text_copy_batch, text_spans


def test_spans_are_the_start_of_each_rows_longest_document():
    tokens = torch.arange(2 * 12).view(2, 12)
    docs = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2], [0] * 12])
    assert [s.tolist() for s in text_spans([{"tokens": tokens, "document_ids": docs}], 5)] == [
        [3, 4, 5, 6, 7], [12, 13, 14, 15, 16]]
    assert len(text_spans([{"tokens": tokens, "document_ids": docs}], 7)) == 1  # row 0's longest is 6 tokens
    assert len(text_spans([{"tokens": tokens, "document_ids": docs}], 5, limit=1)) == 1


def test_first_occurrence_and_repeat_score_the_same_tokens():
    half = 6
    spans = [torch.tensor([5, 9, 2, 7, 3, 8]), torch.tensor([1, 4, 4, 6, 2, 9])]
    batch = text_copy_batch(spans)
    labels = batch["labels"]
    assert batch["tokens"].shape == (2, 2 * half) and (labels[:, :half - 1] == labels[:, half:2 * half - 1]).all()
    # a model that copies perfectly and otherwise predicts token 4
    log_probs = torch.full((2, 2 * half, 10), -10.0)
    log_probs[..., 4] = 0.0
    log_probs[:, half:2 * half - 1].scatter_(-1, batch["labels"][:, half:2 * half - 1, None], 5.0)
    tally = TextCopyTally()
    tally.add(log_probs, batch, half)
    first_right = int((batch["labels"][:, :half - 1] == 4).sum())  # the second span's two 4s
    assert (tally.first, tally.repeat, tally.tokens) == (first_right, 2 * (half - 1), 2 * (half - 1))
    m = tally.metrics("t_")
    assert m["t_accuracy"] == 1.0 and m["t_first_accuracy"] == first_right / 10 and m["t_gain"] == 1 - first_right / 10
