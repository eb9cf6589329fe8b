"""The in-context score (evaluation/metrics.py ContextTally) against a plain loop over positions."""
from __future__ import annotations

import math

import torch

from cplm_megatron.evaluation.metrics import ContextTally, context_windows


def test_windows_scale_with_the_sequence_length():
    assert context_windows(256) == ((16, 32), (128, 256))
    assert context_windows(2048) == ((128, 256), (1024, 2048))
    assert context_windows(8) == ((0, 1), (4, 8))


def test_score_is_late_minus_early_mean_nll_by_context_position():
    g = torch.Generator().manual_seed(0)
    b, s = 3, 64
    nll = torch.rand(b, s, generator=g, dtype=torch.float64) * 8
    select = torch.rand(b, s, generator=g) > 0.2
    positions = torch.stack([torch.arange(s), torch.arange(s) % 40, (torch.arange(s) + 17) % s])
    tally = ContextTally(s)
    tally.add_nll(nll[:2], select[:2], positions[:2])  # two batches add up
    tally.add_nll(nll[2:], select[2:], positions[2:])
    sums = {"early": [0.0, 0], "late": [0.0, 0]}
    for r in range(b):
        for t in range(s):
            p = int(positions[r, t])
            key = "early" if 4 <= p < 8 else "late" if 32 <= p < 64 else None
            if key and select[r, t]:
                sums[key][0] += float(nll[r, t])
                sums[key][1] += 1
    expected = sums["late"][0] / sums["late"][1] - sums["early"][0] / sums["early"][1]
    assert math.isclose(tally.score, expected, rel_tol=1e-12, abs_tol=1e-12)
    assert tally.counts == (sums["early"][1], sums["late"][1])


def test_score_without_tokens_in_a_window_is_nan():
    tally = ContextTally(64)
    tally.add_nll(torch.ones(1, 8), torch.ones(1, 8, dtype=torch.bool), torch.arange(8)[None])
    assert math.isnan(tally.score)
