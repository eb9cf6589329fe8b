"""A rule-based scorer for testing the tasks with exactly known answers (no neural network).

Induction rule: at position t, find the latest earlier position j with x_j == x_t and predict
x_{j+1} with probability `confidence` (the rest spread evenly); with no earlier occurrence, predict
uniformly. On copy data it gets the repeat right (after its first token); on SpamLang every
position but the first; on passkey every key token but the first (the query marker differs from
the needle marker).
"""
from __future__ import annotations

import math

import torch


class InductionScorer:
    """Implements the Scorer protocol of cplm_megatron.evaluation.scorers."""

    backend = "induction"
    description = "induction rule"
    has_copy_head = True
    document_masking = True

    def __init__(self, vocab_size: int, max_length: int = 1024, confidence: float = 0.9):
        self.vocab_size, self.max_length, self.confidence = vocab_size, max_length, confidence

    def predictions(self, tokens: torch.Tensor) -> torch.Tensor:
        """[b, s] predicted token per position, -1 where the current token has no earlier occurrence."""
        pred = torch.full_like(tokens, -1)
        for row in range(tokens.shape[0]):
            last = {}
            seq = tokens[row].tolist()
            for t, x in enumerate(seq):
                if x in last:
                    pred[row, t] = seq[last[x] + 1]
                last[x] = t
        return pred

    def log_probs(self, batch: dict) -> torch.Tensor:
        tokens = batch["tokens"]
        b, s = tokens.shape
        v = self.vocab_size
        out = torch.full((b, s, v), -math.log(v))
        pred = self.predictions(tokens)
        rows, cols = torch.nonzero(pred >= 0, as_tuple=True)
        out[rows, cols] = math.log((1 - self.confidence) / (v - 1))
        out[rows, cols, pred[rows, cols]] = math.log(self.confidence)
        return out
