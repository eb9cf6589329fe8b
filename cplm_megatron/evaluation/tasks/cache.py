"""`cache`: the model plus a test-time continuous cache (Grave et al. 2017), the control that prices trivial copying.

lambda and theta are tuned on the dev split (`--dev-data`, default: the `dev/` beside `--data`, which
tools/build_stdlib_corpus.py writes; as many samples as `val` scores), then the validation split is
scored with and without the cache over the same positions as `val` (its samples, spread across the set).
Reports the cache's val loss with its document-bootstrap interval, the model's own val loss, their paired
difference with its interval, and the tuned lambda / theta.
The math (and its float64 reference test): cplm_megatron.evaluation.continuous_cache.
"""
from __future__ import annotations

from pathlib import Path

import torch

from cplm_megatron.evaluation import continuous_cache as cache
from cplm_megatron.evaluation.metrics import (
    DocumentTally,
    bootstrap_paired_ci,
    bootstrap_ratio_ci,
    target_log_probs,
)
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Batch, Scorer, document_segments, hidden_and_log_probs
from cplm_megatron.evaluation.tasks.base import TaskResult, progress
from cplm_megatron.evaluation.tasks.val import ValSample, open_val_loader, sample_note, val_paths, val_sample


def hidden_and_target_log_probs(scorer: Scorer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Final (normed) hidden states [b, s, d] and the model's log p(label) [b, s] of one batch."""
    hidden, log_probs = hidden_and_log_probs(scorer, batch)
    return hidden, target_log_probs(log_probs, batch["labels"])


def dev_path(options: EvalOptions, val: list[str]) -> str:
    """`dev_data`, else the dev/ split beside the (first) validation dataset."""
    path = options.dev_data or str(Path(val[0]).parent / "dev")
    if not (Path(path) / "manifest.json").is_file():
        raise ValueError(f"task cache: no dev split at {path} to tune lambda/theta on; pass --dev-data DIR or rebuild "
                         f"the corpus with tools/build_stdlib_corpus.py (it writes DIR/dev)")
    return path


def _segments(scorer: Scorer, sample: ValSample, show: bool, desc: str) -> list[tuple]:
    """(hidden, labels, valid, model log p(y), documents) per document segment of every batch."""
    out = []
    for batch, documents in progress(list(zip(sample.batches, sample.documents)), desc, show):
        hidden, target = hidden_and_target_log_probs(scorer, batch)
        for row, start, end in document_segments(batch):
            out.append((hidden[row, start:end], batch["labels"][row, start:end],
                        batch["loss_mask"][row, start:end].bool(), target[row, start:end], documents[row, start:end]))
    return out


def _tally(lp: torch.Tensor, documents: torch.Tensor) -> DocumentTally:
    tally = DocumentTally.empty()
    tally.add_nll(-lp, torch.ones_like(lp, dtype=torch.bool), documents)
    return tally


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    paths = val_paths(scorer, options)
    dev = dev_path(options, paths)
    dev_loader = open_val_loader([dev], options.batch_size, scorer.document_masking, scorer.vocab_size)
    # the dev split under the same sample budget as val (every sample with --val-all)
    dev_segments = _segments(scorer, val_sample(dev_loader, options), options.show_progress, "cache dev")
    sq = [float((h[v.to(h.device)].double() ** 2).sum(-1).mean()) for h, _, v, _, _ in dev_segments if v.any()]
    thetas = cache.theta_grid(sum(sq) / max(len(sq), 1))
    lam, theta, dev_loss = cache.tune(cache.collect(dev_segments, thetas))
    del dev_segments
    val_loader = open_val_loader(paths, options.batch_size, scorer.document_masking, scorer.vocab_size)
    sample = val_sample(val_loader, options)
    inputs = cache.collect(_segments(scorer, sample, options.show_progress, "cache val"), (theta,))
    mixed = cache.mix_target_log_probs(inputs.model_lp, inputs.cache_lp[theta], inputs.has, lam)
    with_cache, without = _tally(mixed, inputs.documents), _tally(inputs.model_lp, inputs.documents)
    nll_c, count, docs = with_cache.arrays()
    nll_m, _, _ = without.arrays(docs)
    low, high = bootstrap_ratio_ci(nll_c, count)
    diff, diff_low, diff_high = bootstrap_paired_ci(nll_c, nll_m, count)
    return TaskResult(
        "cache",
        {"cache_val_loss": with_cache.loss, "cache_val_loss_ci_low": low, "cache_val_loss_ci_high": high,
         "model_val_loss": without.loss, "cache_minus_model": diff, "cache_minus_model_ci_low": diff_low,
         "cache_minus_model_ci_high": diff_high, "cache_lambda": lam, "cache_theta": theta},
        {"data": paths, "dev": dev, "dev_loss_at_tuned": dev_loss, "lambdas": list(cache.LAMBDAS),
         "thetas": list(thetas), "tokens": int(inputs.model_lp.numel()), "sequences": sample.sequences,
         "samples_available": sample.available, "scored": sample_note(sample.sequences, sample.available),
         "documents": {"ids": docs, "nll": nll_c, "count": count},
         "interval": "95% percentile bootstrap over documents (2000 resamples)"},
    )
