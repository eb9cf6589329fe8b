"""Token-level reductions of next-token log-probs: NLL, argmax accuracy, perplexity."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def target_log_probs(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(y_t) [b, s] from log-probs [b, s, V] and labels [b, s]."""
    return log_probs.gather(-1, labels.long().clamp_min(0)[..., None]).squeeze(-1)


def argmax_correct(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Bool [b, s]: the most likely token is the label."""
    return log_probs.argmax(dim=-1) == labels


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
        picked = target_log_probs(log_probs, labels)[select].double()
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
