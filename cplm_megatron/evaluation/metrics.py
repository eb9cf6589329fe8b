"""Token-level reductions of next-token log-probs: NLL, argmax accuracy, perplexity."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def target_log_probs(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(y_t) [b, s] from log-probs [b, s, V] and labels [b, s] (on the log-probs' device: a GPU model's
    [b, s, V] never leaves it)."""
    return log_probs.gather(-1, labels.to(log_probs.device).long().clamp_min(0)[..., None]).squeeze(-1)


def argmax_correct(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Bool [b, s] (on the labels' device): the most likely token is the label."""
    return log_probs.argmax(dim=-1).to(labels.device) == labels


@dataclass
class TokenTally:
    """Running sums over the selected tokens of many batches."""

    nll_sum: float = 0.0
    prob_sum: float = 0.0
    correct: int = 0
    count: int = 0

    def add(self, log_probs: torch.Tensor, labels: torch.Tensor, select: torch.Tensor) -> None:
        """Count positions where `select` ([b, s], bool or 0/1) is set."""
        select = select.bool()
        picked = target_log_probs(log_probs, labels)[select.to(log_probs.device)].double()
        self.nll_sum += float(-picked.sum())
        self.prob_sum += float(picked.exp().sum())
        self.correct += int(argmax_correct(log_probs, labels)[select].sum())
        self.count += int(select.sum())

    @property
    def loss(self) -> float:
        """Mean NLL (nats per token)."""
        return self.nll_sum / self.count if self.count else float("nan")

    @property
    def mean_target_prob(self) -> float:
        """Mean probability of the label."""
        return self.prob_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0)) if self.count else float("nan")


def document_index(tokens: torch.Tensor, eod_id: int, offset: int) -> tuple[torch.Tensor, int]:
    """Global document number [b, s] of every input position of consecutive packed rows, and the next offset.

    Rows of one unshuffled pass tile the EOD-separated stream (sample i's tokens are stream[i*S:(i+1)*S]),
    so a position's document is the number of EODs before it in the stream (an EOD belongs to the
    document it ends)."""
    is_eod = (tokens == eod_id).long().flatten()
    before = torch.cumsum(is_eod, 0) - is_eod
    return (before + offset).view_as(tokens), offset + int(is_eod.sum())


@dataclass
class DocumentTally:
    """NLL sums and token counts per document, for intervals that resample documents (not tokens)."""

    nll: dict[int, float]
    count: dict[int, int]

    @classmethod
    def empty(cls) -> DocumentTally:
        return cls({}, {})

    def add(self, log_probs: torch.Tensor, labels: torch.Tensor, select: torch.Tensor, documents: torch.Tensor) -> None:
        """Add the selected positions' NLL to their documents ([b, s] documents from `document_index`)."""
        select = select.bool()
        self.add_nll(-target_log_probs(log_probs, labels).double(), select, documents)

    def add_nll(self, nll: torch.Tensor, select: torch.Tensor, documents: torch.Tensor) -> None:
        """Add per-position NLL [b, s] (already computed) at the selected positions."""
        docs = documents[select.bool()]
        values = nll[select.bool().to(nll.device)].double().cpu()
        for doc, total, n in zip(*_group_sums(docs, values)):
            self.nll[doc] = self.nll.get(doc, 0.0) + total
            self.count[doc] = self.count.get(doc, 0) + n

    def arrays(self, order: list[int] | None = None) -> tuple[list[float], list[int], list[int]]:
        """(nll sums, counts, document numbers) in `order` (default: sorted documents)."""
        docs = sorted(self.nll) if order is None else order
        return [self.nll[d] for d in docs], [self.count[d] for d in docs], docs

    @property
    def loss(self) -> float:
        total = sum(self.count.values())
        return sum(self.nll.values()) / total if total else float("nan")


def _group_sums(docs: torch.Tensor, values: torch.Tensor) -> tuple[list[int], list[float], list[int]]:
    unique, inverse = torch.unique(docs, return_inverse=True)
    sums = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, values)
    counts = torch.zeros(len(unique), dtype=torch.long).index_add_(0, inverse, torch.ones_like(inverse))
    return unique.tolist(), sums.tolist(), counts.tolist()


BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 12345


def bootstrap_ratio_ci(nll: list[float], count: list[int], level: float = 0.95, samples: int = BOOTSTRAP_SAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of sum(nll)/sum(count) when documents are resampled with replacement."""
    import numpy as np

    nll_a, count_a = np.asarray(nll, dtype=np.float64), np.asarray(count, dtype=np.float64)
    if nll_a.size == 0:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, nll_a.size, size=(samples, nll_a.size))
    ratios = nll_a[idx].sum(axis=1) / np.maximum(count_a[idx].sum(axis=1), 1.0)
    alpha = (1.0 - level) / 2
    return float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def bootstrap_paired_ci(nll_a: list[float], nll_b: list[float], count: list[int], level: float = 0.95,
                        samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(difference, low, high) of loss(a) - loss(b) on the same documents (the same tokens), documents resampled."""
    import numpy as np

    a, b, n = (np.asarray(x, dtype=np.float64) for x in (nll_a, nll_b, count))
    if a.size == 0:
        return float("nan"), float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, a.size, size=(samples, a.size))
    diffs = (a[idx].sum(axis=1) - b[idx].sum(axis=1)) / np.maximum(n[idx].sum(axis=1), 1.0)
    alpha = (1.0 - level) / 2
    return float((a.sum() - b.sum()) / n.sum()), float(np.quantile(diffs, alpha)), float(np.quantile(diffs, 1 - alpha))


def context_windows(seq_len: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(early, late) context-position windows of the in-context score: [T/16, T/8) and [T/2, T)."""
    return (seq_len // 16, max(seq_len // 8, seq_len // 16 + 1)), (seq_len // 2, seq_len)


@dataclass
class ContextTally:
    """NLL at early and late context positions (tokens seen in the document so far, `position_ids`): the in-context
    score is mean NLL late minus mean NLL early (Olsson et al. 2022's loss at token 500 minus token 50, here over
    windows scaled to the sequence length); negative: later tokens are predicted better, the context is used."""

    seq_len: int
    sums: tuple[float, float] = (0.0, 0.0)
    counts: tuple[int, int] = (0, 0)

    def add_nll(self, nll: torch.Tensor, select: torch.Tensor, positions: torch.Tensor) -> None:
        """Add per-position NLL [b, s] at the selected positions, by their context position [b, s]."""
        nll, select, positions = nll.double().cpu(), select.bool().cpu(), positions.cpu()
        sums, counts = list(self.sums), list(self.counts)
        for i, (low, high) in enumerate(context_windows(self.seq_len)):
            inside = select & (positions >= low) & (positions < high)
            sums[i] += float(nll[inside].sum())
            counts[i] += int(inside.sum())
        self.sums, self.counts = (sums[0], sums[1]), (counts[0], counts[1])

    @property
    def score(self) -> float:
        """Mean NLL in the late window minus the early one (nan without tokens in both)."""
        if not all(self.counts):
            return float("nan")
        return self.sums[1] / self.counts[1] - self.sums[0] / self.counts[0]
