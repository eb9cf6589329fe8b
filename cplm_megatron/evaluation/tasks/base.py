"""What a task returns, and the batching/progress helpers the synthetic tasks share."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from cplm_megatron.data.synthetic import make_batch
from cplm_megatron.evaluation.scorers import Batch


@dataclass
class TaskResult:
    """Headline numbers (one table row each) and structured details (tables, grids) of one task."""

    name: str
    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "details": self.details}


def batches_of(samples: Sequence[torch.Tensor], batch_size: int) -> Iterator[Batch]:
    """Loader-contract batches of [n + 1]-token samples (one document per row)."""
    for i in range(0, len(samples), batch_size):
        yield make_batch(list(samples[i:i + batch_size]))


def progress(items: list, desc: str, enabled: bool, unit: str = "batch") -> Iterator:
    """A tqdm bar (on stderr) over `items`."""
    return iter(tqdm(items, desc=desc, unit=unit, disable=not enabled, leave=False))
