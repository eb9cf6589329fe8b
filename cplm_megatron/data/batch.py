"""Turn packed samples into the training batch every model component consumes.

Batch contract (all tensors ``[micro_batch, seq_len]``):

* ``tokens`` int64: inputs ``x_0 .. x_{S-1}`` of each packed window;
* ``labels`` int64: targets ``x_1 .. x_S``;
* ``loss_mask`` float32: 1 where the label is a real token, 0 where it is EOD padding; with
  ``eod_mask_loss`` also 0 where the *input* is EOD (the prediction that crosses into the next
  document), as Megatron-LM's ``--eod-mask-loss`` does;
* ``position_ids`` int64: with ``document_masking``, the offset from the start of the token's
  document segment (0 at each document start and at the sample start); else ``0 .. S-1``;
* ``document_ids`` int64: the index of the token's document segment within the sample (0, 1, ...;
  EOD padding is its own segment), with or without ``document_masking``: copy candidates never
  cross a document, whatever the attention does.

A document's EOD belongs to that document, so with document masking the EOD attends to its own
document and the next token starts a new segment.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from cplm_megatron.data.repeated_spans import repeat_span


def segment_ids_and_positions(segment_starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per input position: index of its segment and offset within it, given sorted segment starts."""
    starts = np.asarray(segment_starts, dtype=np.int64)
    starts = starts[starts < seq_len]
    boundary = np.zeros(seq_len, dtype=np.int64)
    boundary[starts[starts > 0]] = 1
    segment = np.cumsum(boundary)
    first = np.concatenate([[0], starts[starts > 0]])  # start offset of segment k
    positions = np.arange(seq_len, dtype=np.int64) - first[segment]
    return segment, positions


def collate_packed_samples(
    samples: Sequence[Mapping[str, Any]], *, eod_id: int, document_masking: bool, eod_mask_loss: bool,
    repeat_span_share: float = 0.0, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Stack packed samples (MDS records: tokens, segment_starts, num_tokens) into a batch; `repeat_span_share`
    of them with a span of their own text repeated (data/repeated_spans.py; training only)."""
    windows = np.stack([np.asarray(s["tokens"], dtype=np.int64) for s in samples])
    if repeat_span_share > 0:
        windows = np.stack([repeat_span(w, np.asarray(s["segment_starts"]), int(s["num_tokens"]), eod_id,
                                        repeat_span_share, seed)[0] for w, s in zip(windows, samples)])
    seq_len = windows.shape[1] - 1
    tokens, labels = windows[:, :-1], windows[:, 1:]
    label_index = np.arange(seq_len)
    num_tokens = np.array([int(s["num_tokens"]) for s in samples], dtype=np.int64)
    loss_mask = (label_index[None, :] + 1 < num_tokens[:, None]).astype(np.float32)
    if eod_mask_loss:
        loss_mask[tokens == eod_id] = 0.0
    pairs = [segment_ids_and_positions(s["segment_starts"], seq_len) for s in samples]
    document_ids = np.stack([p[0] for p in pairs])
    if document_masking:
        position_ids = np.stack([p[1] for p in pairs])
    else:
        position_ids = np.broadcast_to(label_index, tokens.shape).copy()
    return {
        "tokens": torch.from_numpy(np.ascontiguousarray(tokens)),
        "labels": torch.from_numpy(np.ascontiguousarray(labels)),
        "loss_mask": torch.from_numpy(loss_mask),
        "position_ids": torch.from_numpy(position_ids),
        "document_ids": torch.from_numpy(document_ids),
    }
