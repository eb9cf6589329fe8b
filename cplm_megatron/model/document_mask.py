"""The attention mask of document masking: document ids, turned by each core attention into what it needs.

The step passes `document_ids_mask(document_ids)`, an integer `[b, 1, 1, s]` tensor of every token's document id
(the whole sequence, also under context parallelism), where megatron-core expects a boolean `[b, 1, s, s]` mask.
Megatron hands the mask to every layer's core attention untouched (through recompute too: values survive
`detach`, where Python attributes would not), so nothing builds an `[s, s]` tensor unless the attention needs one:

* SDPA without context parallelism: `document_spans` -> one causal attention per document, by the backend
  `select_document_backend` picks once at model build: `varlen` (torch's flash varlen kernel, CUDA, torch >= 2.10;
  `is_causal` or `window_size` signature), `njt` (nested jagged tensors through SDPA, CUDA), `per_document`
  (one SDPA call per document: CPU, and attention dropout, which varlen lacks);
* SDPA under context parallelism and megatron-core's unfused attention: `dense_document_mask`, built once per
  micro-batch (and once per layer under recompute).
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

DOCUMENT_BACKENDS = ("varlen", "njt", "per_document")  # the order of preference
log = logging.getLogger(__name__)
_logged: set = set()


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


def varlen_attn_function() -> Optional[Callable[..., torch.Tensor]]:
    """torch's `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10), or None where this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_call_kwargs(fn: Callable[..., Any], scale: float, gqa: bool) -> dict:
    """The keyword arguments of a causal `varlen_attn` call for this signature: `window_size=(-1, 0)` (torch >=
    2.12) or `is_causal=True` (2.10/2.11); `enable_gqa` where it takes it and k/v have fewer heads."""
    params = inspect.signature(fn).parameters
    if "window_size" in params:
        kwargs: dict = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        kwargs = {"is_causal": True}
    else:
        raise TypeError(f"varlen_attn{inspect.signature(fn)} takes neither window_size nor is_causal")
    if "scale" in params:
        kwargs["scale"] = scale
    if gqa and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return kwargs


def available_document_backends(cuda: bool, varlen: Optional[Callable[..., Any]] = None,
                                dropout: bool = False) -> tuple:
    """The backends that can run here, in order of preference (`varlen` needs CUDA, this torch's varlen_attn with
    a causal argument, and no dropout; `njt` CUDA; `per_document` runs everywhere)."""
    out = []
    if cuda and not dropout and varlen is not None:
        params = inspect.signature(varlen).parameters
        if "window_size" in params or "is_causal" in params:
            out.append("varlen")
    if cuda:
        out.append("njt")
    out.append("per_document")
    return tuple(out)


def select_document_backend(cuda: bool, dropout: bool = False) -> str:
    """The document-masking backend of a model built here: the first available one."""
    return available_document_backends(cuda, varlen_attn_function(), dropout)[0]


def log_document_backend(backend: str) -> None:
    """Log the chosen backend once per process (every layer's attention makes the same choice)."""
    if backend not in _logged:
        _logged.add(backend)
        log.info("document masking attention: %s (torch %s)", backend, torch.__version__)
