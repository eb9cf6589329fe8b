"""`copy`: random token spans repeated once; next-token accuracy and loss on the repeat.

A sample is span + span (cplm_megatron.data.synthetic.copy_sample). Scored positions are those
predicting the 2nd..last token of the repeat: the first repeated token follows the span's last token,
which the model has not seen followed by anything yet, so it is not copyable.
"""
from __future__ import annotations

import torch

from cplm_megatron.data.synthetic import copy_sample
from cplm_megatron.evaluation.metrics import TokenTally, argmax_correct
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks.base import TaskResult, batches_of, progress


def check_length(length: int, scorer: Scorer, what: str) -> None:
    """Error early when a task's sequence is longer than the model supports."""
    if length > scorer.max_length:
        raise ValueError(f"{what}={length} exceeds the model's max_position_embeddings={scorer.max_length}; "
                         f"choose a shorter {what}")


def repeat_mask(batch_size: int, length: int) -> torch.Tensor:
    """Bool [b, length]: label positions predicting the 2nd..last token of the repeat."""
    half = (length + 1) // 2
    mask = torch.zeros(batch_size, length, dtype=torch.bool)
    mask[:, half:] = True
    return mask


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    length = options.copy_length
    check_length(length, scorer, "copy_length")
    n = options.sequences("copy")
    samples = [copy_sample(i, length, scorer.vocab_size, options.eval_seed)[0] for i in range(n)]
    tally = TokenTally()
    sequences_right = 0
    for batch in progress(list(batches_of(samples, options.batch_size)), "copy", options.show_progress):
        log_probs = scorer.log_probs(batch)
        select = repeat_mask(*batch["labels"].shape)
        tally.add(log_probs, batch["labels"], select)
        correct = argmax_correct(log_probs, batch["labels"]) | ~select
        sequences_right += int(correct.all(dim=1).sum())
    return TaskResult(
        "copy",
        {"copy_accuracy": tally.accuracy, "copy_loss": tally.loss, "copy_sequence_accuracy": sequences_right / n},
        {"sequences": n, "length": length, "scored_tokens": tally.count},
    )
