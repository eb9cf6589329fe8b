"""Evaluation settings shared by the tasks (one object, filled from the evaluate CLI or by callers)."""
from __future__ import annotations

from dataclasses import dataclass

from cplm_megatron.data.synthetic import COPY_LAYOUTS

# Sequences per task when `limit` is not given (passkey: per length x depth cell; val and cache: spread evenly
# across the validation set, every one with `val_all`).
DEFAULT_LIMITS: dict[str, int | None] = {"val": 256, "copy": 64, "passkey": 8, "spamlang": 64, "gradient": 8}
# Synthetic evaluation samples use their own seed so they are not the training samples (SpamLang,
# whose samples are just the V symbols, is the exception: any sample is a possible training sample).
EVAL_SEED = 20_000_003


@dataclass
class EvalOptions:
    """What to evaluate on and how much."""

    batch_size: int = 8
    limit: int | None = None  # sequences per task (per cell for passkey); None: DEFAULT_LIMITS
    seed: int = 0  # added to EVAL_SEED
    data: str | None = None  # prepared dataset dir for `val`; None: the run's data.val_streams
    val_all: bool = False  # `val` and `cache` score every validation sample whatever `limit` says
    dev_data: str | None = None  # prepared dataset for tuning (cache lambda/theta); None: `data`'s sibling dev/
    copy_length: int = 128  # tokens per copy sequence (a span and its repeat)
    copy_layout: str = "half"  # half: span + span (the `copy` training task); random: as `copy_random`
    spamlang_length: int = 128
    passkey_lengths: tuple[int, ...] = (64, 128, 256)
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_key_len: int = 4
    gradient_source: str = "copy"  # the batch of the gradient task: copy | spamlang | val
    lm_eval_tasks: str | None = None  # comma-separated lm-eval task names; None: the built-in local tasks
    lm_eval_include: str | None = None  # --include_path for lm-eval; None: write the built-in tasks
    lm_eval_args: tuple[str, ...] = ()  # extra lm_eval command-line arguments, passed through
    show_progress: bool = True

    def sequences(self, task: str) -> int | None:
        """How many sequences `task` evaluates (None: all available)."""
        return self.limit if self.limit is not None else DEFAULT_LIMITS.get(task)

    @property
    def eval_seed(self) -> int:
        return EVAL_SEED + self.seed

    def validate(self) -> None:
        """Raise ValueError naming the bad option."""
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")
        if self.copy_length < 4 or self.spamlang_length < 2:
            raise ValueError(f"copy_length must be >= 4 and spamlang_length >= 2 (got {self.copy_length}, "
                             f"{self.spamlang_length})")
        if self.copy_layout not in COPY_LAYOUTS:
            raise ValueError(f"copy_layout must be one of {COPY_LAYOUTS}, got {self.copy_layout!r}")
        if not self.passkey_lengths or not self.passkey_depths:
            raise ValueError("passkey_lengths and passkey_depths must not be empty")
        bad_depths = [d for d in self.passkey_depths if not 0.0 <= d <= 1.0]
        if bad_depths:
            raise ValueError(f"passkey depths must lie in [0, 1], got {bad_depths}")
        if self.gradient_source not in ("copy", "spamlang", "val"):
            raise ValueError(f"gradient_source must be copy, spamlang or val, got {self.gradient_source!r}")
