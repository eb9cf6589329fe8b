"""Passkey retrieval and copy accuracy by context length: the `passkey` and `copy` tasks run at each length
(benchmarks/long_context.py evaluates a baseline and a CPLM trained at one length on longer ones).

Per length: `copy_accuracy` (next-token accuracy on the repeat; `options.copy_layout` says where the repeat lies)
beside `copy_accuracy_one_token_match` (a copier matching the current token alone, on the same samples) with, for
a CPLM, `copy_head_accuracy` and `copy_mean_gate`; `passkey_first_token_accuracy` (the retrieval figure: k_1 after the
query marker, averaged over the needle depths) with the whole-key `passkey_accuracy` and the per-depth cells.
Chance values: 1/(V-1) for copy, 1/(V-3) for the passkey's first token (the tasks' own).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks import TASKS

COPY_KEYS = ("copy_accuracy", "copy_accuracy_one_token_match", "copy_loss", "copy_head_accuracy", "copy_mean_gate")
PASSKEY_KEYS = ("passkey_first_token_accuracy", "passkey_accuracy", "passkey_token_accuracy")


def check_lengths(scorer: Scorer, lengths: Sequence[int]) -> None:
    """ValueError naming the lengths beyond the model's positions (the fix: a larger max_position_embeddings)."""
    too_long = [L for L in lengths if L > scorer.max_length]
    if not lengths or too_long:
        raise ValueError(f"context lengths {list(too_long or lengths)}: need 1 <= length <= the model's "
                         f"max_position_embeddings={scorer.max_length}; train with a larger "
                         f"model.max_position_embeddings (RoPE: no parameters) or pass shorter lengths")


def evaluate_by_length(scorer: Scorer, lengths: Sequence[int], options: EvalOptions) -> dict[str, Any]:
    """{'model', 'copy_head', 'chance': {...}, 'by_length': [{length, copy_*, passkey_*, passkey_by_depth,
    seconds, cpu_seconds}]}: the copy task at copy_length = L and the passkey task at passkey_lengths = (L,) for each L."""
    options.validate()
    check_lengths(scorer, lengths)
    rows = []
    chance: dict[str, float] = {}
    for length in lengths:
        start, cpu = time.perf_counter(), time.process_time()
        copy = TASKS["copy"](scorer, replace(options, copy_length=length))
        passkey = TASKS["passkey"](scorer, replace(options, passkey_lengths=(length,)))
        row: dict[str, Any] = {"length": length}
        row.update({k: copy.metrics[k] for k in COPY_KEYS if k in copy.metrics})
        row.update({k: passkey.metrics[k] for k in PASSKEY_KEYS})
        row["passkey_by_depth"] = [{k: cell[k] for k in ("depth", "first_token_accuracy", "accuracy")}
                                   for cell in passkey.details["grid"]]
        row["copy_sequences"] = copy.details["sequences"]
        row["passkey_samples_per_depth"] = passkey.details["samples_per_cell"]
        row["seconds"] = round(time.perf_counter() - start, 3)
        row["cpu_seconds"] = round(time.process_time() - cpu, 3)  # this process's CPU time (a shared core: < seconds)
        chance = {"copy_accuracy": copy.metrics["copy_accuracy_chance"],
                  "passkey_first_token_accuracy": passkey.metrics["passkey_first_token_chance"]}
        rows.append(row)
    return {"model": scorer.description, "copy_head": scorer.has_copy_head, "chance": chance, "by_length": rows}
