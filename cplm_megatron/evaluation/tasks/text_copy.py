"""`text_copy`: held-out text repeated once (evaluation/text_copy.py); accuracy on the repeat beside the same tokens'
accuracy at their first occurrence, and the difference (what copying buys). The spans come from the validation
set the `val` task reads (`--data`, else the run's validation streams): twice `limit` (default 64) samples spread
across it, one span per sample with a document of at least copy_length / 2 tokens, `limit` of those spread again."""
from __future__ import annotations

from dataclasses import replace

from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks.base import TaskResult, progress
from cplm_megatron.evaluation.tasks.copy import check_length
from cplm_megatron.evaluation.tasks.val import open_val_loader, spread_indices, val_paths, val_sample
from cplm_megatron.evaluation.text_copy import TextCopyTally, text_copy_batch, text_spans


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    half = options.copy_length // 2
    check_length(2 * half, scorer, "copy_length")
    paths = val_paths(scorer, options)
    loader = open_val_loader(paths, options.batch_size, scorer.document_masking, scorer.vocab_size)
    wanted = options.sequences("copy")
    sample = val_sample(loader, replace(options, val_all=False, limit=2 * wanted))
    found = text_spans(sample.batches, half)
    spans = [found[i] for i in spread_indices(len(found), wanted)]
    if not spans:
        raise ValueError(f"task text_copy: no validation sample holds a document of {half} tokens; pass a smaller "
                         f"--copy-length")
    tally = TextCopyTally()
    chunks = [spans[i:i + options.batch_size] for i in range(0, len(spans), options.batch_size)]
    for chunk in progress(chunks, "text_copy", options.show_progress):
        batch = text_copy_batch(chunk)
        tally.add(scorer.log_probs(batch), batch, half)
    return TaskResult("text_copy", tally.metrics("text_copy_"),
                      {"data": paths, "sequences": len(spans), "length": 2 * half})
