"""`data.repeat_span_share`: a declared share of training samples in which a span of their own text recurs.

In a chosen sample, a span of its longest document segment (1/8 to 1/2 of the segment's tokens) is written again at
a random later offset of that segment, as the `copy_random` task lays out random tokens: the repeat can be predicted
by finding the earlier occurrence by content. It speeds up the emergence of in-context copying (induction) in small
models. Which samples are chosen, and where, is a pure function of the sample's tokens and `data.seed`: the same
samples change in every arm of an experiment, under any layout and after a resume. Validation data is never changed.
"""
from __future__ import annotations

import hashlib

import numpy as np


def sample_rng(window: np.ndarray, seed: int) -> np.random.Generator:
    """A generator keyed by the window's token ids and the data seed."""
    digest = hashlib.blake2b(np.ascontiguousarray(window, dtype=np.int64).tobytes(), digest_size=8,
                             key=int(seed).to_bytes(8, "little")).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def longest_segment(segment_starts: np.ndarray, length: int, eod_id: int, window: np.ndarray) -> tuple[int, int]:
    """[start, end) of the window's longest document segment, its closing EOD left out."""
    starts = sorted({0, *(int(s) for s in segment_starts if 0 < int(s) < length)})
    ends = starts[1:] + [length]
    best = max(zip(starts, ends), key=lambda se: se[1] - se[0])
    start, end = best
    while end > start and window[end - 1] == eod_id:
        end -= 1
    return start, end


def repeat_span(window: np.ndarray, segment_starts: np.ndarray, num_tokens: int, eod_id: int, share: float,
                seed: int) -> tuple[np.ndarray, tuple[int, int, int] | None]:
    """(the window, with a span of its longest segment repeated later in it for a `share` of windows; (source,
    repeat, length) of the change or None). `window` holds seq_len + 1 tokens; tokens from `num_tokens` on are
    padding and stay as they are."""
    rng = sample_rng(window, seed)
    if share <= 0 or rng.random() >= share:
        return window, None
    start, end = longest_segment(segment_starts, min(len(window), int(num_tokens)), eod_id, window)
    n = end - start
    if n < 8:
        return window, None
    span = int(rng.integers(max(2, n // 8), n // 2 + 1))
    source = start + int(rng.integers(0, n - 2 * span + 1))
    repeat = int(rng.integers(source + span, end - span + 1))
    out = window.copy()
    out[repeat:repeat + span] = window[source:source + span]
    return out, (source, repeat, span)
