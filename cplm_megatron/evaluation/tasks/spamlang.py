"""`spamlang`: Godey & Artzi's SpamLang (each sequence repeats one random symbol); next-token accuracy.

`spamlang_accuracy` counts every position. Position 0 has nothing earlier to copy from, so the
Copy-Paste head cannot help there; `spamlang_accuracy_after_first` leaves it out.
"""
from __future__ import annotations

from cplm_megatron.data.synthetic import spamlang_sample
from cplm_megatron.evaluation.metrics import TokenTally
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks.base import TaskResult, batches_of, progress
from cplm_megatron.evaluation.tasks.copy import check_length


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    length = options.spamlang_length
    check_length(length, scorer, "spamlang_length")
    n = options.sequences("spamlang")
    samples = [spamlang_sample(i, length, scorer.vocab_size, options.eval_seed) for i in range(n)]
    every, after_first = TokenTally(), TokenTally()
    for batch in progress(list(batches_of(samples, options.batch_size)), "spamlang", options.show_progress):
        log_probs = scorer.log_probs(batch)
        labels = batch["labels"]
        select = batch["loss_mask"].bool()
        every.add(log_probs, labels, select)
        select[:, 0] = False
        after_first.add(log_probs, labels, select)
    return TaskResult(
        "spamlang",
        {"spamlang_accuracy": every.accuracy, "spamlang_accuracy_after_first": after_first.accuracy,
         "spamlang_loss": every.loss, "spamlang_target_prob": every.mean_target_prob},
        {"sequences": n, "length": length},
    )
