"""`val`: validation loss and perplexity on a prepared dataset (packed, document-masked samples).

The dataset is `--data` (a prepared dataset directory, e.g. data/stdlib/val) or the streams of the
run's `data.val_streams`. Loss-masked positions (EOD padding) are left out, as in training.
"""
from __future__ import annotations

import itertools
import random
import time

from cplm_megatron.data.config import DataConfig
from cplm_megatron.data.manifest import read_manifest
from cplm_megatron.evaluation.metrics import TokenTally
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
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


def open_val_loader(paths: list[str], batch_size: int, document_masking: bool, vocab_size: int, attempts: int = 5):
    """The validation loader (one pass, unshuffled) over `paths` in this single process.

    Streaming names its shared-memory segments by probing /dev/shm for a free prefix, which races when
    another process opens a dataset at the same moment (FileExistsError on /dev/shm/NNNNNN_locals); the
    open is retried after a short random pause.
    """
    from cplm_megatron.data.loader import build_val_loader

    seq_len = read_manifest(paths[0]).seq_len
    cfg = DataConfig(val_streams=list(paths), seq_len=seq_len, micro_batch=batch_size, global_batch=batch_size,
                     document_masking=document_masking)
    for attempt in range(attempts):
        try:
            return build_val_loader(cfg, 0, 1, model_vocab_size=vocab_size)
        except FileExistsError:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0.2, 1.0))


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    paths = val_paths(scorer, options)
    loader = open_val_loader(paths, options.batch_size, scorer.document_masking, scorer.vocab_size)
    limit = options.sequences("val")
    n_batches = len(loader) if limit is None else min(len(loader), -(-limit // options.batch_size))
    tally = TokenTally()
    batches = list(itertools.islice(iter(loader), n_batches))
    for batch in progress(batches, "val", options.show_progress):
        tally.add(scorer.log_probs(batch), batch["labels"], batch["loss_mask"])
    return TaskResult(
        "val",
        {"val_loss": tally.loss, "val_ppl": tally.perplexity, "val_accuracy": tally.accuracy},
        {"data": paths, "sequences": n_batches * options.batch_size, "tokens": tally.count},
    )
