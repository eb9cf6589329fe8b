"""Loop bounds that let the fused kernels skip tiles no candidate pair can live in.

With documents, query ``t`` only sees keys of its own document, so a query tile need not visit
keys before the first position of any of its documents, and a key tile need not visit queries
after the last position of any of its documents. Works for arbitrary document ids (documents need
not be contiguous runs); pure torch, O(b * T log T). Also gives compact int32 document ranks,
so the kernels compare 32-bit ids whatever the caller's id dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DocumentIndex:
    """Per position (int32 ``[b, T]`` each): its document's rank within the row (compact ids the
    kernels compare in 32 bits), and the first and last index of that document."""

    rank: torch.Tensor
    first: torch.Tensor
    last: torch.Tensor


def index_documents(doc_ids: torch.Tensor) -> DocumentIndex:
    """Compact ranks and spans of arbitrary integer document ids, row by row."""
    b, T = doc_ids.shape
    sorted_ids, order = torch.sort(doc_ids, dim=1, stable=True)
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[:, 1:] = sorted_ids[:, 1:] != sorted_ids[:, :-1]
    group = torch.cumsum(starts, dim=1) - 1  # document rank within the row, in sorted order
    first_of_group = torch.full((b, T), T, dtype=order.dtype, device=order.device)
    first_of_group.scatter_reduce_(1, group, order, reduce="amin")
    last_of_group = torch.full((b, T), -1, dtype=order.dtype, device=order.device)
    last_of_group.scatter_reduce_(1, group, order, reduce="amax")

    def unsort(values: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(order).scatter_(1, order, values).to(torch.int32)

    return DocumentIndex(unsort(group), unsort(first_of_group.gather(1, group)),
                         unsort(last_of_group.gather(1, group)))


def query_tile_key_start(first: torch.Tensor, block_m: int, block_n: int, keys: int | None = None) -> torch.Tensor:
    """For each query tile of ``block_m`` rows: the first key index to visit, a multiple of ``block_n``.
    ``first`` [b, Tq]: the first position of each query's document (global under CP, where ``keys`` is the
    number of keys T; default Tq)."""
    b, T = first.shape
    n_tiles = math.ceil(T / block_m)
    pad = T if keys is None else keys  # past-the-end rows never lower a tile's start
    padded = torch.nn.functional.pad(first, (0, n_tiles * block_m - T), value=pad)
    lo = padded.view(b, n_tiles, block_m).amin(dim=-1)
    return (torch.div(lo, block_n, rounding_mode="floor") * block_n).to(torch.int32).contiguous()


def key_tile_query_bounds(positions: torch.Tensor, T: int, block_m: int, block_n: int) -> torch.Tensor:
    """For each key tile of ``block_n`` of the ``T`` keys, two query rows (int32 ``[2, tiles]``, multiples of
    ``block_m``): the first tile of queries to visit (the first row whose global position, ``positions``
    increasing int ``[Tq]``, lies past the tile's first key, rounded down) and the first tile whose rows all lie
    past the tile's last key (rounded up: from there on no causal mask is needed)."""
    starts = torch.arange(0, T, block_n, device=positions.device, dtype=positions.dtype)
    first = torch.searchsorted(positions, torch.stack((starts, starts + (block_n - 1))), right=True)
    first[0] = torch.div(first[0], block_m, rounding_mode="floor")
    first[1] = torch.div(first[1] + (block_m - 1), block_m, rounding_mode="floor")
    return (first * block_m).to(torch.int32).contiguous()


def key_tile_query_end(last: torch.Tensor, block_n: int) -> torch.Tensor:
    """For each key tile of ``block_n`` rows: one past the last query index that can see it."""
    b, T = last.shape
    n_tiles = math.ceil(T / block_n)
    padded = torch.nn.functional.pad(last, (0, n_tiles * block_n - T), value=-1)
    return (padded.view(b, n_tiles, block_n).amax(dim=-1) + 1).to(torch.int32).contiguous()
