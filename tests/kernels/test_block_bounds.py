"""Document index: exact compact ranks and spans, and conservative per-tile loop bounds."""
import torch

from cplm_kernels.block_bounds import (
    index_documents,
    key_tile_query_bounds,
    key_tile_query_end,
    query_tile_key_start,
)
from cplm_kernels.reference import candidate_masks


def _docs():
    gen = torch.Generator().manual_seed(0)
    runs = torch.cumsum(torch.rand(2, 90, generator=gen) < 0.08, dim=1)
    interleaved = torch.randint(0, 4, (2, 90), generator=gen) * 1000 - 7  # arbitrary, non-contiguous ids
    return runs, interleaved


def test_document_index_matches_brute_force():
    for doc_ids in _docs():
        index = index_documents(doc_ids)
        assert index.rank.dtype == torch.int32
        for b in range(doc_ids.shape[0]):
            # ranks are a relabelling: equal ranks <=> equal ids
            # boolean masks
            assert torch.equal(index.rank[b, :, None] == index.rank[b, None, :], doc_ids[b, :, None] == doc_ids[b, None])
            for t in range(doc_ids.shape[1]):
                same = (doc_ids[b] == doc_ids[b, t]).nonzero().flatten()
                assert index.first[b, t] == same.min() and index.last[b, t] == same.max()


def test_tile_bounds_never_cut_a_candidate_pair():
    labels = torch.zeros(2, 90, dtype=torch.long)
    for doc_ids in _docs():
        cand, _ = candidate_masks(labels, doc_ids)  # [b, t, j]
        index = index_documents(doc_ids)
        first, last = index.first, index.last
        for block_m, block_n in ((16, 32), (32, 16), (64, 64)):
            key_start = query_tile_key_start(first, block_m, block_n)
            assert (key_start % block_n == 0).all()
            for tile in range(key_start.shape[1]):
                rows = cand[:, tile * block_m:(tile + 1) * block_m]
                for b in range(2):
                    assert not rows[b, :, : key_start[b, tile]].any()
            query_end = key_tile_query_end(last, block_n)
            for tile in range(query_end.shape[1]):
                cols = cand[:, :, tile * block_n:(tile + 1) * block_n]
                for b in range(2):
                    assert not cols[b, query_end[b, tile]:].any()


def test_bounds_skip_work_for_contiguous_documents():
    doc_ids = torch.arange(256)[None] // 64  # four documents of 64
    index = index_documents(doc_ids)
    first, last = index.first, index.last
    assert query_tile_key_start(first, 64, 32).tolist() == [[0, 64, 128, 192]]
    assert key_tile_query_end(last, 64).tolist() == [[64, 128, 192, 256]]


def test_query_bounds_of_key_tiles_under_context_parallelism():
    """A CP rank's queries (increasing global positions, two chunks): no query row before a key tile's start sees
    a key of the tile (position <= the tile's first key); from the second bound on, every row lies past the
    tile's last key (no causal mask needed); both are multiples of block_m, start <= full."""
    from cplm_megatron.parallel.context import local_positions

    T = 96
    for n, r in ((1, 0), (2, 1), (4, 0), (4, 3)):
        pos = local_positions(T, n, r).to(torch.int32)
        for block_m, block_n in ((16, 16), (16, 32), (32, 16)):
            bounds = key_tile_query_bounds(pos, T, block_m, block_n)
            assert bounds.dtype == torch.int32 and bounds.shape == (2, -(-T // block_n))
            assert (bounds % block_m == 0).all() and (bounds[0] <= bounds[1]).all()
            for tile, (s, full) in enumerate(bounds.t().tolist()):
                assert (pos[:s] <= tile * block_n).all()  # skipped rows see no key j >= tile * block_n
                later = pos > tile * block_n
                assert not later.any() or s <= int(later.nonzero()[0])  # the first row that does is visited
                past = pos > min(T, (tile + 1) * block_n) - 1
                assert past[full:].all()  # rows from `full` on lie past every key of the tile
                if past.any():
                    assert full - block_m < int(past.nonzero()[0])  # and `full` is the first such tile
