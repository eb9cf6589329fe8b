"""Trainer callbacks: work that runs at the training loop's fixed points without the loop knowing what it is
(the in-training probes of evaluation/probes.py, added by `cplm_megatron.pretrain`)."""
from __future__ import annotations

from typing import Protocol


class Callback(Protocol):
    """What the trainer calls; every rank calls it at the same points (collectives are allowed)."""

    def on_start(self, trainer) -> None:
        """After the run is built, resumed and its run dir written; before the first step of this launch."""

    def on_iteration(self, trainer, iteration: int) -> None:
        """After iteration `iteration` (1-based) has stepped, been logged and evaluated; before any save."""
