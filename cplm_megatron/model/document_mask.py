"""The attention mask of document masking: document ids, turned by each core attention into what it needs.

The step passes `document_ids_mask(document_ids)`, an integer `[b, 1, 1, s]` tensor of every token's document id
(the whole sequence, also under context parallelism), where megatron-core expects a boolean `[b, 1, s, s]` mask.
Megatron hands the mask to every layer's core attention untouched (through recompute too: values survive
`detach`, where Python attributes would not), so nothing builds an `[s, s]` tensor unless the attention needs one:

* SDPA without context parallelism: `document_spans` -> one causal attention per document (flash varlen on CUDA);
* SDPA under context parallelism and megatron-core's unfused attention: `dense_document_mask`, built once per
  micro-batch (and once per layer under recompute).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


def document_ids_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """[b, s] document ids -> the `[b, 1, 1, s]` integer attention mask the model's core attention reads."""
    return document_ids[:, None, None, :]


def is_document_ids(mask: Optional[torch.Tensor]) -> bool:
    """Whether an attention mask is `document_ids_mask`'s form (a boolean mask is Megatron's dense one)."""
    return mask is not None and mask.dtype != torch.bool


def dense_document_mask(mask: torch.Tensor, query_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Document ids -> Megatron's boolean mask `[b, 1, q, s]` (True = masked): causal and same document; all
    query rows, or those at `query_positions` (a context-parallel rank's tokens). A boolean mask passes as is.
    Kept on the mask object, so the layers of one micro-batch build it once."""
    if not is_document_ids(mask):
        return mask
    key = "_cplm_dense" if query_positions is None else "_cplm_dense_cp"
    cached = getattr(mask, key, None)
    if cached is not None:
        return cached
    ids = mask[:, 0, 0, :]
    keys = torch.arange(ids.shape[1], device=ids.device)
    queries = keys if query_positions is None else query_positions.to(ids.device)
    causal = keys[None, :] <= queries[:, None]
    same = ids[:, queries, None] == ids[:, None, :]
    dense = ~(causal[None] & same)[:, None]
    setattr(mask, key, dense)
    return dense


@dataclass(frozen=True)
class DocumentSpans:
    """The documents of a micro-batch as spans of its flattened `b * s` tokens (no span crosses a row)."""

    offsets: torch.Tensor  # [n + 1] int64 on the mask's device: document i is tokens offsets[i]:offsets[i+1]
    bounds: tuple  # the same offsets on the host, for slicing
    max_len: int


def document_spans(mask: torch.Tensor) -> DocumentSpans:
    """The spans of `document_ids_mask`'s documents (a new document starts where the id changes or a row
    starts). One host sync per micro-batch: kept on the mask object."""
    cached = getattr(mask, "_cplm_spans", None)
    if cached is not None:
        return cached
    ids = mask[:, 0, 0, :]
    b, s = ids.shape
    starts = torch.ones(b, s, dtype=torch.bool, device=ids.device)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    first = starts.reshape(-1).nonzero().squeeze(1)
    offsets = torch.cat([first, torch.tensor([b * s], device=ids.device)])
    bounds = tuple(int(x) for x in offsets.tolist())
    spans = DocumentSpans(offsets, bounds, max(hi - lo for lo, hi in zip(bounds, bounds[1:])))
    mask._cplm_spans = spans
    return spans
