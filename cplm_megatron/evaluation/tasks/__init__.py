"""The evaluation tasks by name; each is `run(scorer, options) -> TaskResult`."""
from __future__ import annotations

from collections.abc import Callable

from cplm_megatron.evaluation.tasks import (
    cache,
    copy,
    gradient,
    lmeval,
    passkey,
    spamlang,
    text_copy,
    val,
)
from cplm_megatron.evaluation.tasks.base import TaskResult

TASKS: dict[str, Callable[..., TaskResult]] = {
    "val": val.run,
    "copy": copy.run,
    "text_copy": text_copy.run,
    "passkey": passkey.run,
    "spamlang": spamlang.run,
    "gradient": gradient.run,
    "cache": cache.run,
    "lm-eval": lmeval.run,
}

__all__ = ["TASKS", "TaskResult"]
