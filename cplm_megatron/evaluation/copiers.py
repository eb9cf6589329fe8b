"""Copiers that need no model: the controls a copy accuracy is read against (cplm_megatron.evaluation.tasks.copy).

`one_token_match_hits`: a copier that predicts the current token's most frequent earlier successor (ties split):
near 1 where tokens rarely recur, ~V/L once a random token recurs L/V times in the context, so a model above it
matches more than one token. `copy_task_controls` recomputes the copy task's controls from its samples alone (the
layout, count, length, vocabulary and seed the task drew them with), for evaluations recorded before a control
existed.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from cplm_megatron.data.synthetic import CopySample, copy_task_sample


def one_token_match_hits(sample: CopySample) -> float:
    """Expected right predictions on the scored repeat of a copier that predicts the most frequent successor of the
    current token among its earlier occurrences (ties split evenly; a token not seen before: wrong)."""
    x = sample.tokens.tolist()
    successors: defaultdict[int, Counter] = defaultdict(Counter)
    hits = 0.0
    for t in range(sample.repeat_start + sample.repeat_len - 1):
        if t > 0:
            successors[x[t - 1]][x[t]] += 1
        seen = successors.get(x[t])
        if t >= sample.repeat_start and seen:
            top = max(seen.values())
            if seen[x[t + 1]] == top:
                hits += 1 / sum(1 for count in seen.values() if count == top)
    return hits


def copy_task_controls(layout: str, sequences: int, length: int, vocab_size: int, seed: int) -> dict[str, float]:
    """Chance (span tokens are uniform over 1..V-1) and the one-token-match copier's accuracy on the copy task's
    scored positions (the 2nd..last token of each repeat)."""
    samples = [copy_task_sample(layout, i, length, vocab_size, seed) for i in range(sequences)]
    scored = sum(s.repeat_len - 1 for s in samples)
    return {"copy_accuracy_chance": 1.0 / (vocab_size - 1),
            "copy_accuracy_one_token_match": sum(map(one_token_match_hits, samples)) / scored}
