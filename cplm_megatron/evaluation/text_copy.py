"""Copying held-out text: the first `half` tokens of a validation document's segment, then the same tokens again.

The copy task's layout (data/synthetic.py copy_sample: span, span, the span's first token) over natural tokens
instead of uniform random ones. Scored: the span's tokens 2..half at their first occurrence (no earlier copy in
context: what the model predicts from the text alone) and the same tokens in the repeat (positions half..2 half-2);
`gain` is the difference, the part of the accuracy that copying buys. Used by the `text_copy` evaluation task and
the in-training probe.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cplm_megatron.data.synthetic import make_batch

Batch = dict[str, torch.Tensor]


def text_spans(batches: list[Batch], half: int, limit: int | None = None) -> list[torch.Tensor]:
    """The first `half` tokens of each row's longest document segment (rows whose longest segment is shorter are
    skipped), at most `limit`."""
    spans = []
    for batch in batches:
        for tokens, docs in zip(batch["tokens"], batch["document_ids"]):
            ids, counts = torch.unique_consecutive(docs, return_counts=True)
            longest = int(counts.argmax())
            if int(counts[longest]) < half:
                continue
            start = int(counts[:longest].sum())
            spans.append(tokens[start:start + half].clone())
            if limit is not None and len(spans) == limit:
                return spans
    return spans


def text_copy_batch(spans: list[torch.Tensor]) -> Batch:
    """Loader-contract batch of span + span + the span's first token, one document per row."""
    return make_batch([torch.cat([s, s, s[:1]]) for s in spans])


@dataclass
class TextCopyTally:
    """Right predictions of the span's tokens 2..half at their first occurrence and in the repeat."""

    first: int = 0
    repeat: int = 0
    tokens: int = 0

    def add(self, log_probs: torch.Tensor, batch: Batch, half: int) -> None:
        """Count one batch of `text_copy_batch` (log-probs [b, 2 half, V'])."""
        right = log_probs.argmax(-1).to(batch["labels"].device) == batch["labels"]
        self.first += int(right[:, :half - 1].sum())
        self.repeat += int(right[:, half:2 * half - 1].sum())
        self.tokens += int(right.shape[0]) * (half - 1)

    def metrics(self, prefix: str) -> dict[str, float]:
        """`<prefix>accuracy` (the repeat), `<prefix>first_accuracy`, `<prefix>gain`, `<prefix>tokens`."""
        n = max(self.tokens, 1)
        return {f"{prefix}accuracy": self.repeat / n, f"{prefix}first_accuracy": self.first / n,
                f"{prefix}gain": (self.repeat - self.first) / n, f"{prefix}tokens": self.tokens}
