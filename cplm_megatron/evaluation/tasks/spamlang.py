"""`spamlang`: Godey & Artzi's SpamLang (each sequence repeats one random symbol); next-token accuracy.

`spamlang_accuracy` counts every position. Position 0 has nothing earlier to copy from, so the
Copy-Paste head cannot help there; `spamlang_accuracy_after_first` leaves it out.

Beside them, the trivial copiers on the same samples and positions (the controls a copy mechanism is read against):
`spamlang_accuracy_previous_token`, a copier that predicts the token it was just given (right at every position
of SpamLang, position 0 included), and `spamlang_accuracy_cache` / `spamlang_loss_cache`, this model plus a
continuous cache (Grave et al. 2017; cplm_megatron.evaluation.continuous_cache) whose lambda/theta are tuned for NLL on as
many other SpamLang samples (the next sample indices), scored by the argmax of the mixture: on a baseline it is
the copy mechanism available at test time without training one.
"""
from __future__ import annotations

import torch

from cplm_megatron.data.synthetic import spamlang_sample
from cplm_megatron.evaluation import continuous_cache as cache
from cplm_megatron.evaluation.metrics import TokenTally, target_log_probs
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import HFScorer, MegatronScorer, Scorer, hidden_and_log_probs
from cplm_megatron.evaluation.tasks.base import TaskResult, batches_of, progress
from cplm_megatron.evaluation.tasks.copy import check_length


def _samples(first: int, n: int, length: int, scorer: Scorer, options: EvalOptions) -> list[torch.Tensor]:
    return [spamlang_sample(first + i, length, scorer.vocab_size, options.eval_seed) for i in range(n)]


def _cache_segments(scorer: Scorer, samples: list[torch.Tensor], options: EvalOptions,
                    score: tuple[float, float] | None = None) -> tuple[list[tuple], int]:
    """(hidden, labels, valid, model log p(y), document) per sample (one document per row) and, with `score`
    = (theta, lambda), how many scored positions the mixture's argmax gets right."""
    out, right = [], 0
    for batch in batches_of(samples, options.batch_size):
        hidden, log_probs = hidden_and_log_probs(scorer, batch)
        target = target_log_probs(log_probs, batch["labels"])
        for row in range(batch["tokens"].shape[0]):
            labels, valid = batch["labels"][row], batch["loss_mask"][row].bool()
            out.append((hidden[row], labels, valid, target[row], torch.full_like(labels, len(out))))
            if score is not None:
                correct = cache.cache_argmax_correct(hidden[row], log_probs[row], labels, valid, *score)
                right += int(correct[valid.to(correct.device)].sum())
    return out, right


def cache_control(scorer: Scorer, samples: list[torch.Tensor], first_dev: int, options: EvalOptions) -> dict:
    """The model + continuous cache on `samples`: lambda/theta tuned on as many samples from index `first_dev`."""
    dev, _ = _cache_segments(scorer, _samples(first_dev, len(samples), len(samples[0]) - 1, scorer, options), options)
    sq = [float((h.double() ** 2).sum(-1).mean()) for h, *_ in dev]
    lam, theta, _ = cache.tune(cache.collect(dev, cache.theta_grid(sum(sq) / len(sq))))
    segments, right = _cache_segments(scorer, samples, options, score=(theta, lam))
    inputs = cache.collect(segments, (theta,))
    mixed = cache.mix_target_log_probs(inputs.model_lp, inputs.cache_lp[theta], inputs.has, lam)
    return {"spamlang_accuracy_cache": right / mixed.numel(), "spamlang_loss_cache": float(-mixed.mean()),
            "spamlang_cache_lambda": lam, "spamlang_cache_theta": theta}


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    length = options.spamlang_length
    check_length(length, scorer, "spamlang_length")
    n = options.sequences("spamlang")
    samples = _samples(0, n, length, scorer, options)
    every, after_first = TokenTally(), TokenTally()
    repeats = positions = 0
    for batch in progress(list(batches_of(samples, options.batch_size)), "spamlang", options.show_progress):
        log_probs = scorer.log_probs(batch)
        labels = batch["labels"]
        select = batch["loss_mask"].bool()
        every.add(log_probs, labels, select)
        repeats += int((labels == batch["tokens"])[select].sum())
        positions += int(select.sum())
        select[:, 0] = False
        after_first.add(log_probs, labels, select)
    metrics = {"spamlang_accuracy": every.accuracy, "spamlang_accuracy_after_first": after_first.accuracy,
               "spamlang_loss": every.loss, "spamlang_target_prob": every.mean_target_prob,
               "spamlang_accuracy_previous_token": repeats / positions}
    if isinstance(scorer, (MegatronScorer, HFScorer)):
        metrics.update(cache_control(scorer, samples, n, options))
    return TaskResult("spamlang", metrics, {"sequences": n, "length": length,
                                            "controls": "previous_token: predicts the token just given; cache: this "
                                                        "model + a continuous cache tuned on other SpamLang samples"})
