"""`val`: validation loss and perplexity on a prepared dataset (packed, document-masked samples).

The dataset is `--data` (a prepared dataset directory, e.g. data/stdlib/val) or the streams of the
run's `data.val_streams`. Loss-masked positions (EOD padding) are left out, as in training.
Every sample is scored unless `limit` (or, with `val_all`, nothing) cuts it; the 95% interval of the
loss resamples documents (a document spans several packed samples; its tokens are not independent),
and `details.documents` holds each document's NLL sum and token count so that a study can form paired
intervals between models scored on the same split. `val_in_context_score` is the mean NLL at late context
positions minus early ones (evaluation/metrics.py ContextTally; negative: the model uses its context).
"""
from __future__ import annotations

import itertools

from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.data.manifest import read_manifest
from cplm_megatron.evaluation.metrics import (
    ContextTally,
    DocumentTally,
    TokenTally,
    bootstrap_ratio_ci,
    context_windows,
    document_index,
    target_log_probs,
)
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer, hidden_and_log_probs, lm_head_log_probs
from cplm_megatron.evaluation.tasks.base import TaskResult, progress


def val_paths(scorer: Scorer, options: EvalOptions) -> list[str]:
    """`options.data`, else the validation streams of the checkpoint's run (none for synthetic-data runs)."""
    if options.data:
        return [options.data]
    config = getattr(scorer, "config", None)
    trained_on_text = config is not None and not getattr(config.data, "synthetic", None)
    streams = [s.path for s in config.data.val_streams] if trained_on_text else []
    if not streams:
        raise ValueError(f"task val: no validation data for {scorer.description}; pass --data DIR (a prepared "
                         f"dataset, e.g. data/stdlib/val)")
    return streams


def open_val_loader(paths: list[str], batch_size: int, document_masking: bool, vocab_size: int,
                    keep_last: bool = True):
    """The validation loader (one pass, unshuffled) over `paths` in this single process; `keep_last`: the
    last, partial batch too (every sample)."""
    from cplm_megatron.data.loader import build_val_loader

    seq_len = read_manifest(paths[0]).seq_len
    cfg = DataConfig(val_streams=list(paths), document_masking=document_masking)
    shape = BatchShape(seq_len, micro_batch=batch_size, global_batch=batch_size)
    return build_val_loader(cfg, shape, 0, 1, model_vocab_size=vocab_size, keep_last=keep_last)


def val_batches(loader, options: EvalOptions) -> list:
    """The batches the task scores: all of them (`val_all` or no limit), else the first `limit` sequences."""
    limit = None if options.val_all else options.sequences("val")
    n_batches = len(loader) if limit is None else min(len(loader), -(-limit // options.batch_size))
    return list(itertools.islice(iter(loader), n_batches))


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    paths = val_paths(scorer, options)
    loader = open_val_loader(paths, options.batch_size, scorer.document_masking, scorer.vocab_size)
    eod = read_manifest(paths[0]).tokenizer.eod_id
    tally, per_doc, offset, sequences = TokenTally(), DocumentTally.empty(), 0, 0
    batches = val_batches(loader, options)
    context = ContextTally(read_manifest(paths[0]).seq_len)
    lm_tally = TokenTally() if scorer.has_copy_head else tally
    for batch in progress(batches, "val", options.show_progress):
        if scorer.has_copy_head:  # the LM head alone as well: the mixture's gain vs what the LM head learned
            hidden, log_probs = hidden_and_log_probs(scorer, batch)
            lm_tally.add(lm_head_log_probs(scorer, hidden), batch["labels"], batch["loss_mask"])
        else:
            log_probs = scorer.log_probs(batch)
        documents, offset = document_index(batch["tokens"], eod, offset)
        nll = -target_log_probs(log_probs, batch["labels"]).double()
        tally.add(log_probs, batch["labels"], batch["loss_mask"])
        per_doc.add_nll(nll, batch["loss_mask"], documents)
        context.add_nll(nll, batch["loss_mask"], batch["position_ids"])
        sequences += batch["tokens"].shape[0]
    nll, count, docs = per_doc.arrays()
    low, high = bootstrap_ratio_ci(nll, count)
    return TaskResult(
        "val",
        {"val_loss": tally.loss, "val_loss_ci_low": low, "val_loss_ci_high": high, "val_ppl": tally.perplexity,
         "val_accuracy": tally.accuracy, "val_lm_loss": lm_tally.loss, "val_in_context_score": context.score},
        {"data": paths, "sequences": sequences, "samples_available": loader.epoch_size,
         "tokens": tally.count, "documents": {"ids": docs, "nll": nll, "count": count},
         "interval": "95% percentile bootstrap over documents (2000 resamples)",
         "in_context_score": {"windows": context_windows(context.seq_len), "tokens": list(context.counts),
                              "what": "mean NLL at context positions in the late window minus the early one"}},
    )
