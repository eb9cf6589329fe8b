"""`passkey`: retrieve a key hidden at a relative depth of a random-filler context (operating points).

A sample (cplm_megatron.data.synthetic.passkey_sample) is filler with `1 k_1..k_n` inside at the
given depth and `2 k_1..k_n` at the end; the model reads `length` tokens and must predict the final
k_1..k_n. A sample counts as retrieved when every key token is the argmax; the grid holds that rate
(and the per-token rate) per context length x needle depth. Under teacher forcing only k_1 needs retrieval
(k_2..k_n follow k_1 in the needle: a model that copies bigrams gets them once k_1 is given), so
`passkey_first_token_accuracy` (k_1 alone) is the retrieval figure, beside its chance value 1/(V-3) (key
tokens are uniform over 3..V-1).
"""
from __future__ import annotations

import torch

from cplm_megatron.data.synthetic import passkey_sample
from cplm_megatron.evaluation.metrics import TokenTally, argmax_correct
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import Scorer
from cplm_megatron.evaluation.tasks.base import TaskResult, batches_of, progress


def answer_mask(batch_size: int, length: int, answer_start: int, key_len: int) -> torch.Tensor:
    """Bool [b, length]: label positions predicting sample tokens [answer_start, answer_start + key_len)."""
    mask = torch.zeros(batch_size, length, dtype=torch.bool)
    mask[:, answer_start - 1:answer_start - 1 + key_len] = True
    return mask


def run_cell(scorer: Scorer, length: int, depth: float, n: int, first_index: int, options: EvalOptions) -> dict:
    """Retrieval rates of n samples of one (length, depth) operating point."""
    key_len = options.passkey_key_len
    drawn = [passkey_sample(first_index + i, length + 1, depth, scorer.vocab_size, options.eval_seed, key_len)
             for i in range(n)]
    answer_start = drawn[0].answer_start  # the query and key end every sample
    samples = [s.tokens for s in drawn]
    tally = TokenTally()
    retrieved = first_right = 0
    for batch in batches_of(samples, options.batch_size):
        log_probs = scorer.log_probs(batch)
        select = answer_mask(batch["labels"].shape[0], length, answer_start, key_len)
        tally.add(log_probs, batch["labels"], select)
        correct = argmax_correct(log_probs, batch["labels"])
        retrieved += int((correct | ~select).all(dim=1).sum())
        first_right += int(correct[:, answer_start - 1].sum())
    return {"length": length, "depth": depth, "accuracy": retrieved / n, "token_accuracy": tally.accuracy,
            "first_token_accuracy": first_right / n, "loss": tally.loss, "samples": n}


def run(scorer: Scorer, options: EvalOptions) -> TaskResult:
    n = options.sequences("passkey")
    lengths = [L for L in options.passkey_lengths if L <= scorer.max_length]
    skipped = [L for L in options.passkey_lengths if L > scorer.max_length]
    if not lengths:
        raise ValueError(f"every passkey length {list(options.passkey_lengths)} exceeds the model's "
                         f"max_position_embeddings={scorer.max_length}; pass shorter passkey lengths")
    too_short = [L for L in lengths if L + 1 < 2 * (options.passkey_key_len + 1) + 1]
    if too_short:
        raise ValueError(f"passkey lengths {too_short} cannot hold a key of {options.passkey_key_len} tokens twice")
    cells = [(L, d) for L in lengths for d in options.passkey_depths]
    grid: list[dict] = []
    for index, (length, depth) in enumerate(progress(cells, "passkey", options.show_progress, unit="cell")):
        grid.append(run_cell(scorer, length, depth, n, index * n, options))
    return TaskResult(
        "passkey",
        {"passkey_accuracy": sum(c["accuracy"] for c in grid) / len(grid),
         "passkey_token_accuracy": sum(c["token_accuracy"] for c in grid) / len(grid),
         "passkey_first_token_accuracy": sum(c["first_token_accuracy"] for c in grid) / len(grid),
         "passkey_first_token_chance": 1.0 / (scorer.vocab_size - 3)},
        {"grid": grid, "lengths": lengths, "depths": list(options.passkey_depths), "skipped_lengths": skipped,
         "key_len": options.passkey_key_len, "samples_per_cell": n},
    )
