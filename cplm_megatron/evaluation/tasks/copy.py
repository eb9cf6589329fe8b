"""`copy`: random token spans repeated once; next-token accuracy and loss on the repeat.

`copy_layout` 'half' (the default): a sample is span + span (cplm_megatron.data.synthetic.copy_sample);
'random': a span of random length recurs at a random later offset inside random tokens
(copy_random_sample), so where to copy from is found by content, not by position. Scored positions are
those predicting the 2nd..last token of the repeat: the first repeated token follows a token the model has
not seen followed by the span yet, so it is not copyable.

For a CPLM model also: `copy_head_accuracy` (the argmax of the copy head's own distribution p_copy,
without the LM head) and `copy_mean_gate` (the mean mixture weight g on the scored positions): how
much of the mixture's copy accuracy the copy head carries, and how far the gate opens on copyable text.
`copy_accuracy_chance` is the accuracy of a guess that does not copy (span tokens are uniform over 1..V-1);
`copy_accuracy_one_token_match` that of a copier that matches the current token alone (its most frequent earlier
successor; cplm_megatron.evaluation.copiers): near 1 where tokens rarely recur, ~V/L once a random token recurs L/V
times in the context, so a model above it matches more than one token.
"""
from __future__ import annotations

import torch

from cplm_megatron.data.synthetic import CopySample, copy_task_sample, make_batch
from cplm_megatron.evaluation.copiers import one_token_match_hits
from cplm_megatron.evaluation.metrics import TokenTally, argmax_correct
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Batch, HFScorer, MegatronScorer, Scorer, document_segments
from cplm_megatron.evaluation.tasks.base import TaskResult, progress


def check_length(length: int, scorer: Scorer, what: str) -> None:
    """Error early when a task's sequence is longer than the model supports."""
    if length > scorer.max_length:
        raise ValueError(f"{what}={length} exceeds the model's max_position_embeddings={scorer.max_length}; "
                         f"choose a shorter {what}")


def repeat_mask(samples: list[CopySample], length: int) -> torch.Tensor:
    """Bool [b, length]: label positions predicting the 2nd..last token of each sample's repeat."""
    mask = torch.zeros(len(samples), length, dtype=torch.bool)
    for row, sample in enumerate(samples):
        mask[row, sample.repeat_start:sample.repeat_start + sample.repeat_len - 1] = True
    return mask


@torch.no_grad()
def copy_parts(scorer: Scorer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(mixture log-probs [b, s, V'], the copy head's p_copy [b, s, V'], the mixture weight g [b, s]) of a CPLM
    (None for a scorer whose copy head is not a Megatron or HF module)."""
    if not isinstance(scorer, (MegatronScorer, HFScorer)):
        return None
    from cplm_megatron.evaluation.scorers import hidden_and_log_probs

    hidden, log_probs = hidden_and_log_probs(scorer, batch)
    if isinstance(scorer, MegatronScorer):
        import cplm_kernels
        from cplm_megatron.model.copy_head import candidate_labels

        head = scorer.model.copy_head
        inputs = scorer.model_inputs(batch)
        param = next(head.parameters())
        h = hidden.to(param.device, param.dtype)
        cand = candidate_labels(inputs["labels"], inputs.get("loss_mask"))
        q, k = head.queries_keys(h)
        p_copy, has_cand, lse_all = cplm_kernels.copy_distribution(
            q, k, cand, 0, log_probs.shape[-1], inputs.get("document_ids"), head.scale, head.cfg.block_size,
            return_lse=True)
        gate = head.mixture_weights(h, has_cand, lse_all).gate
        return log_probs, p_copy.float().cpu(), gate.float().cpu()
    import importlib

    model = scorer.model
    modeling = importlib.import_module(type(model).__module__)
    head = model.copy_head
    p_copy = torch.zeros_like(log_probs)
    gate = torch.zeros(log_probs.shape[:2])
    for row, start, end in document_segments(batch):
        ids = batch["tokens"][row:row + 1, start:end]
        h = hidden[row:row + 1, start:end]
        log_p, has, lse = modeling.copy_log_probs(
            head.queries(h), head.keys(h), modeling.candidate_labels(ids),
            modeling.candidate_mask(torch.ones_like(ids, dtype=torch.bool), torch.arange(ids.shape[1])),
            model.config.vocab_size, return_lse=True)
        p_copy[row, start:end, :log_p.shape[-1]] = log_p[0].exp()
        gate[row, start:end] = head.mixture_weights(h, has, lse).gate[0]
    return log_probs, p_copy, gate


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    length = options.copy_length
    check_length(length, scorer, "copy_length")
    n = options.sequences("copy")
    samples = [copy_task_sample(options.copy_layout, i, length, scorer.vocab_size, options.eval_seed) for i in range(n)]
    tally = TokenTally()
    sequences_right = head_right = 0
    gate_sum = 0.0
    chunks = [samples[i:i + options.batch_size] for i in range(0, n, options.batch_size)]
    for chunk in progress(chunks, "copy", options.show_progress):
        batch = make_batch([sample.tokens for sample in chunk])
        select = repeat_mask(chunk, length)
        parts = copy_parts(scorer, batch) if scorer.has_copy_head else None
        if parts is not None:
            log_probs, p_copy, gate = parts
            head_right += int(((p_copy.argmax(-1) == batch["labels"]) & (p_copy.amax(-1) > 0))[select].sum())
            gate_sum += float(gate[select].double().sum())
        else:
            log_probs = scorer.log_probs(batch)
        tally.add(log_probs, batch["labels"], select)
        correct = argmax_correct(log_probs, batch["labels"]) | ~select
        sequences_right += int(correct.all(dim=1).sum())
    metrics = {"copy_accuracy": tally.accuracy, "copy_loss": tally.loss, "copy_sequence_accuracy": sequences_right / n,
               # span tokens are uniform over [1, V): a guess without copying is right with probability 1/(V-1)
               "copy_accuracy_chance": 1.0 / (scorer.vocab_size - 1),
               "copy_accuracy_one_token_match": sum(map(one_token_match_hits, samples)) / tally.count}
    if parts is not None:
        metrics.update(copy_head_accuracy=head_right / tally.count, copy_mean_gate=gate_sum / tally.count)
    return TaskResult("copy", metrics, {"sequences": n, "length": length, "layout": options.copy_layout,
                                        "scored_tokens": tally.count})
