"""The training loop's decisions, one small piece each, built from the config and testable without processes.

`Trainer.run` (trainer.py) owns the model, data and checkpoints and asks these after every step: whether to log
(`Cadence`), evaluate (`Cadence`), checkpoint and stop (`StopPolicy`), and whether too many non-finite losses in a
row end the run (`NonFiniteGuard`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


class NonFiniteLossError(RuntimeError):
    """Too many consecutive non-finite losses."""


@dataclass
class Cadence:
    """Every `interval` iterations (0: never); `also_at` (the last iteration) too."""

    interval: int
    also_at: Optional[int] = None

    def due(self, iteration: int) -> bool:
        return bool(self.interval and iteration % self.interval == 0) or iteration == self.also_at


# 16-bit loss scaling starts at 2**32 and halves after every second overflow (megatron-core's DynamicGradScaler,
# hysteresis 2): ~2 x 32 overflows in a row reach a scale of 1, past which more overflows mean the gradients overflow
# fp16 whatever the scale.
MAX_OVERFLOWS_IN_A_ROW = 70


@dataclass
class NonFiniteGuard:
    """Counts skipped steps in a row: a non-finite loss (`max_in_a_row` of them end the run with
    NonFiniteLossError), or, with a finite loss, a 16-bit loss-scale overflow (the scaler lowers its scale and the
    step is retried: its warm-up skips ~26 steps from the initial scale; MAX_OVERFLOWS_IN_A_ROW end the run)."""

    max_in_a_row: int
    in_a_row: int = 0
    overflows: int = 0

    def observe(self, iteration: int, skipped: bool, loss: float, loss_scale: Optional[float] = None) -> Optional[str]:
        """After each step: None for a step taken (or an overflow after the first of a run of them), else the line to
        print (raises at the limits)."""
        if not skipped:
            settled, self.in_a_row, self.overflows = self.overflows, 0, 0
            if settled:
                return (f"[train] iteration {iteration}: step taken at loss scale {_scale(loss_scale)} after {settled} "
                        f"skipped for gradient overflow")
            return None
        if math.isfinite(loss):
            self.overflows += 1
            if self.overflows >= MAX_OVERFLOWS_IN_A_ROW:
                raise NonFiniteLossError(
                    f"the gradients overflowed 16-bit floats for {self.overflows} consecutive steps (loss {loss:.4g}, "
                    f"loss scale now {_scale(loss_scale)}; last at iteration {iteration}): use precision.dtype=bf16, "
                    f"or lower optimizer.lr. Checkpoints on disk are from before the failure.")
            if self.overflows > 1:
                return None
            return (f"[train] iteration {iteration}: gradients overflowed fp16 at loss scale {_scale(loss_scale)} "
                    f"(loss {loss:.4f} is finite): step skipped, the loss scale is lowered and the next steps retry "
                    f"(the scaler's warm-up skips a few dozen steps; said again when a step is taken)")
        self.in_a_row += 1
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteLossError(
                f"loss was non-finite for {self.in_a_row} consecutive steps (last at iteration {iteration}); lower "
                f"optimizer.lr, check the data, or raise train.max_nonfinite_steps. Checkpoints on disk are from "
                f"before the failure."
            )
        return f"[train] iteration {iteration}: non-finite loss ({loss}), step skipped ({self.in_a_row} in a row)"


def _scale(loss_scale: Optional[float]) -> str:
    return "?" if loss_scale is None else f"{loss_scale:g}"


@dataclass
class StopPolicy:
    """When to checkpoint and when this launch stops early (exit 75): a stop signal, or `exit_after_iters`
    iterations after the launch started at `launch_start`; a checkpoint every `checkpoint_interval` and at
    every early stop."""

    checkpoint_interval: int
    exit_after_iters: Optional[int]
    launch_start: int

    def stop_reason(self, iteration: int, stop_requested: bool, signal: Optional[int] = None) -> Optional[str]:
        """Why the launch stops after `iteration` (None: it goes on). `stop_requested` is the collective answer
        (some rank got a signal: every rank stops); `signal` this rank's own, if any (for the message)."""
        if stop_requested:
            return f"signal {signal}" if signal is not None else "a stop signal on another rank"
        if self.exit_after_iters is not None and iteration - self.launch_start >= self.exit_after_iters:
            return "train.exit_after_iters"
        return None

    def save_due(self, iteration: int, stopping: bool) -> bool:
        return stopping or bool(self.checkpoint_interval and iteration % self.checkpoint_interval == 0)
