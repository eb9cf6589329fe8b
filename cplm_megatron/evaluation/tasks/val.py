"""`val`: validation loss and perplexity on a prepared dataset (packed, document-masked samples).

The dataset is `--data` (a prepared dataset directory, e.g. data/stdlib/val) or the streams of the
run's `data.val_streams`. Loss-masked positions (EOD padding) are left out, as in training.
By default `limit` samples (DEFAULT_LIMITS) spread evenly across the whole set are scored, not its first ones
(a corpus sorted by source would otherwise be judged on one corner of it); `val_all` scores every sample. The
details and the printed table say how many of how many. The 95% interval of the loss resamples the scored
documents (a document spans several packed samples; its tokens are not independent; ids count the EODs before a
position in the whole set, so a document's pieces in two sampled rows stay one document),
and `details.documents` holds each document's NLL sum and token count so that a study can form paired
intervals between models scored on the same split. `val_in_context_score` is the mean NLL at late context
positions minus early ones (evaluation/metrics.py ContextTally; negative: the model uses its context).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

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
from cplm_megatron.evaluation.scorers import Batch, Scorer, hidden_and_log_probs, lm_head_log_probs
from cplm_megatron.evaluation.tasks.base import TaskResult


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


def spread_indices(available: int, wanted: int | None) -> list[int]:
    """`wanted` sample indices spread evenly over `available` (the first included); all of them when `wanted` is None
    or not smaller."""
    if wanted is None or wanted >= available:
        return list(range(available))
    return [i * available // wanted for i in range(wanted)]


@dataclass
class ValSample:
    """The validation samples a task scores, re-batched, with each position's document id in the whole set."""

    batches: list[Batch]
    documents: list[torch.Tensor]  # [b, s] per batch
    available: int  # samples in the set

    @property
    def sequences(self) -> int:
        return sum(int(b["tokens"].shape[0]) for b in self.batches)


def val_sample(loader, options: EvalOptions) -> ValSample:
    """The samples the task scores (`options.sequences("val")` spread across the set, every one with `val_all` or
    no limit) in batches of `options.batch_size`. The set is read to its last chosen sample: document ids count the
    EODs before each position."""
    available = loader.epoch_size
    chosen = spread_indices(available, None if options.val_all else options.sequences("val"))
    keep = torch.zeros(available + 1, dtype=torch.bool)
    keep[chosen] = True
    rows, docs, offset, index = [], [], 0, 0
    eod = loader.tokenizer.eod_id
    for batch in loader if chosen else ():
        documents, offset = document_index(batch["tokens"], eod, offset)
        n = int(batch["tokens"].shape[0])
        picked = keep[index:index + n].nonzero().flatten()
        if len(picked):
            rows.append({k: v[picked] for k, v in batch.items()})
            docs.append(documents[picked])
        index += n
        if index > chosen[-1]:
            break
    size = options.batch_size
    merged = {k: torch.cat([r[k] for r in rows]) for k in rows[0]} if rows else {}
    all_docs = torch.cat(docs) if docs else torch.zeros(0, dtype=torch.long)
    starts = range(0, len(all_docs), size)
    return ValSample([{k: v[i:i + size] for k, v in merged.items()} for i in starts],
                     [all_docs[i:i + size] for i in starts], available)


def val_batches(loader, options: EvalOptions) -> list[Batch]:
    """The batches the task scores (`val_sample`)."""
    return val_sample(loader, options).batches


def sample_note(sequences: int, available: int) -> str:
    """How much of the set was scored, in words."""
    if sequences >= available:
        return f"every one of the {available:,} validation sequences"
    return f"{sequences:,} of {available:,} validation sequences, spread evenly across the set (--val-all: every one)"


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    paths = val_paths(scorer, options)
    loader = open_val_loader(paths, options.batch_size, scorer.document_masking, scorer.vocab_size)
    sample = val_sample(loader, options)
    tally, per_doc = TokenTally(), DocumentTally.empty()
    context = ContextTally(read_manifest(paths[0]).seq_len)
    lm_tally = TokenTally() if scorer.has_copy_head else tally
    with tqdm(total=sample.sequences, desc=f"val ({sample.sequences:,} of {sample.available:,})", unit="seq",
              disable=not options.show_progress, leave=False) as bar:
        for batch, documents in zip(sample.batches, sample.documents):
            if scorer.has_copy_head:  # the LM head alone as well: the mixture's gain vs what the LM head learned
                hidden, log_probs = hidden_and_log_probs(scorer, batch)
                lm_tally.add(lm_head_log_probs(scorer, hidden), batch["labels"], batch["loss_mask"])
            else:
                log_probs = scorer.log_probs(batch)
            nll = -target_log_probs(log_probs, batch["labels"]).double()
            tally.add(log_probs, batch["labels"], batch["loss_mask"])
            per_doc.add_nll(nll, batch["loss_mask"], documents)
            context.add_nll(nll, batch["loss_mask"], batch["position_ids"])
            bar.update(int(batch["tokens"].shape[0]))
    nll, count, docs = per_doc.arrays()
    low, high = bootstrap_ratio_ci(nll, count)
    return TaskResult(
        "val",
        {"val_loss": tally.loss, "val_loss_ci_low": low, "val_loss_ci_high": high, "val_ppl": tally.perplexity,
         "val_accuracy": tally.accuracy, "val_lm_loss": lm_tally.loss, "val_in_context_score": context.score},
        {"data": paths, "sequences": sample.sequences, "samples_available": sample.available,
         "scored": sample_note(sample.sequences, sample.available),
         "tokens": tally.count, "documents": {"ids": docs, "nll": nll, "count": count},
         "interval": "95% percentile bootstrap over the scored documents (2000 resamples)",
         "in_context_score": {"windows": context_windows(context.seq_len), "tokens": list(context.counts),
                              "what": "mean NLL at context positions in the late window minus the early one"}},
    )
