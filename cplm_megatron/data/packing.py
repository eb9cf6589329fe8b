"""Pack EOD-terminated documents into fixed-length training samples, recording document boundaries.

The documents form one token stream ``d_0 EOD d_1 EOD ...``. Sample ``i`` is the window
``stream[i*S : i*S + S + 1]`` (``S`` = seq_len): inputs are its first ``S`` tokens, labels its last
``S``. Consecutive windows share one token (Megatron-LM's GPT dataset layout), so every stream token
after the first is a label exactly once. The final window is padded with EOD up to ``S + 1`` tokens;
``num_tokens`` says where the padding starts, and the loader gives padded labels loss-mask 0.

Each sample stores ``segment_starts``: the sorted offsets in ``[0, S]`` where a document segment
begins (always including 0, the sample start, even mid-document) plus the padding's start.
A document's EOD belongs to that document; the token after an EOD starts the next segment.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class PackedSample:
    """One training window."""

    tokens: np.ndarray  # [seq_len + 1] token ids
    segment_starts: np.ndarray  # int32, sorted, unique, starts with 0
    num_tokens: int  # real tokens; positions >= num_tokens are EOD padding


def token_dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a `vocab_size` vocabulary."""
    if vocab_size <= np.iinfo(np.uint16).max + 1:
        return np.dtype(np.uint16)
    if vocab_size <= np.iinfo(np.uint32).max + 1:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size={vocab_size} does not fit in uint32 token ids")


class SamplePacker:
    """Streams documents in, full samples out; `finish()` emits the padded last sample."""

    def __init__(self, seq_len: int, eod_id: int, vocab_size: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if not 0 <= eod_id < vocab_size:
            raise ValueError(f"eod_id={eod_id} is outside the vocabulary [0, {vocab_size})")
        self.seq_len = seq_len
        self.eod_id = eod_id
        self.vocab_size = vocab_size
        self.dtype = token_dtype_for_vocab(vocab_size)
        self._pending = np.empty(0, dtype=self.dtype)  # stream tokens from the next sample's start on
        self._doc_starts = np.empty(0, dtype=np.int64)  # document starts, relative to _pending[0]
        self.documents = 0
        self.tokens = 0  # real stream tokens (documents + their EODs)
        self.samples = 0
        self.padding_tokens = 0

    def add_document(self, token_ids: Sequence[int]) -> list[PackedSample]:
        """Append one document (its EOD is added here); returns the samples it completed."""
        doc = np.asarray(token_ids, dtype=np.int64)
        if doc.size and (doc.min() < 0 or doc.max() >= self.vocab_size):
            bad = int(doc.min()) if doc.min() < 0 else int(doc.max())
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        start = len(self._pending)
        self._pending = np.concatenate([self._pending, doc.astype(self.dtype), [self.eod_id]]).astype(self.dtype)
        self._doc_starts = np.append(self._doc_starts, start)
        self.documents += 1
        self.tokens += doc.size + 1
        return self._emit_full_windows()

    def _window(self, begin: int, num_tokens: int) -> PackedSample:
        """The sample starting at _pending[begin] with `num_tokens` real tokens (rest padding)."""
        length = self.seq_len + 1
        tokens = self._pending[begin : begin + num_tokens]
        if num_tokens < length:
            tokens = np.concatenate([tokens, np.full(length - num_tokens, self.eod_id, dtype=self.dtype)])
        lo, hi = np.searchsorted(self._doc_starts, [begin + 1, begin + num_tokens], side="left")
        starts = [0] + [int(s) - begin for s in self._doc_starts[lo:hi]]
        if num_tokens < length:
            starts.append(num_tokens)
        self.samples += 1
        self.padding_tokens += length - num_tokens
        return PackedSample(tokens=tokens.copy(), segment_starts=np.asarray(starts, dtype=np.int32), num_tokens=num_tokens)

    def _emit_full_windows(self) -> list[PackedSample]:
        count = (len(self._pending) - 1) // self.seq_len
        samples = [self._window(j * self.seq_len, self.seq_len + 1) for j in range(count)]
        if count:
            consumed = count * self.seq_len
            self._pending = self._pending[consumed:]
            self._doc_starts = self._doc_starts[self._doc_starts >= consumed] - consumed
        return samples

    def finish(self) -> list[PackedSample]:
        """The last, EOD-padded sample if any labels remain uncovered (a stream of n tokens has n-1)."""
        remaining = len(self._pending)
        samples = [self._window(0, remaining)] if remaining >= 2 else []
        self._pending = self._pending[remaining:]
        self._doc_starts = self._doc_starts[:0]
        return samples
