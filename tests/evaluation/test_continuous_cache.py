"""The continuous cache (Grave et al. 2017) against an independent float64 loop, and the `cache` task on a real model."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cplm_megatron.evaluation import continuous_cache as cache
from cplm_megatron.evaluation.metrics import bootstrap_paired_ci, bootstrap_ratio_ci
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.tasks import cache as cache_task
from cplm_megatron.evaluation.tasks import val

# Both sides are float64: the vectorized path (matmul, logsumexp) and the loop (math.exp, sums) differ by the
# order of O(n) roundings of magnitude <= |theta h.h| ~ 10, i.e. ~ n * 10 * 2^-53 ~ 1e-13; 1e-10 leaves room.
TOL = 1e-10


def naive_p(hidden, labels, valid, theta, lam, model_p, t):
    """p(y_t) = (1 - lam) p_model + lam sum_{i<t, valid, y_i = y_t} e^{theta h_t.h_i} / sum_{i<t, valid} e^{...}."""
    h = hidden.tolist()
    dots = [theta * sum(a * b for a, b in zip(h[t], h[i])) for i in range(t) if valid[i]]
    labs = [int(labels[i]) for i in range(t) if valid[i]]
    if not dots:
        return model_p
    weights = [math.exp(x) for x in dots]
    p_cache = sum(w for w, y in zip(weights, labs) if y == int(labels[t])) / sum(weights)
    return (1 - lam) * model_p + lam * p_cache


def test_cache_mixture_equals_a_float64_loop():
    g = torch.Generator().manual_seed(3)
    n, d = 14, 6
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (n,), generator=g)  # a small vocabulary: labels recur
    valid = torch.ones(n, dtype=torch.bool)
    valid[5] = False  # a padded label is neither an entry nor scored
    model_p = torch.rand(n, generator=g, dtype=torch.float64) * 0.5 + 0.01
    for theta, lam in ((0.7, 0.3), (2.0, 0.05), (0.1, 0.9)):
        lp, has = cache.cache_target_log_probs(hidden, labels, valid, theta)
        mixed = cache.mix_target_log_probs(model_p.log(), lp, has, lam)
        for t in range(n):
            expected = naive_p(hidden, labels, valid, theta, lam, float(model_p[t]), t)
            assert float(mixed[t]) == pytest.approx(math.log(expected), abs=TOL), (theta, lam, t)
    assert not has[0] and has[1:].all()


def naive_mixture_argmax(hidden, log_probs, labels, valid, theta, lam, t) -> int:
    """The argmax of (1 - lam) p_model(v) + lam p_cache(v) over the whole vocabulary, from loops (first index on
    a tie): p_cache(v) = sum_{i<t, valid, y_i = v} e^{theta h_t.h_i} / sum_{i<t, valid} e^{...}."""
    p_model = [math.exp(x) for x in log_probs[t].tolist()]
    h = hidden.tolist()
    earlier = [i for i in range(t) if valid[i]]
    if not earlier:
        mixed = p_model
    else:
        weights = {i: math.exp(theta * sum(a * b for a, b in zip(h[t], h[i]))) for i in earlier}
        total = sum(weights.values())
        p_cache = [0.0] * len(p_model)
        for i in earlier:
            p_cache[int(labels[i])] += weights[i] / total
        mixed = [(1 - lam) * m + lam * c for m, c in zip(p_model, p_cache)]
    return max(range(len(mixed)), key=lambda v: (mixed[v], -v))


def test_cache_argmax_equals_the_full_mixture_over_the_vocabulary():
    """The mixture's argmax compared at the earlier labels and the model's argmax only equals the argmax over every
    token (loops, float64): p_cache is zero outside the earlier labels."""
    g = torch.Generator().manual_seed(7)
    n, d, vocab = 24, 5, 9
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64)
    labels = torch.randint(0, vocab, (n,), generator=g)
    valid = torch.ones(n, dtype=torch.bool)
    valid[4] = False
    log_probs = torch.log_softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2, dim=-1)
    checked = 0
    for theta, lam in ((0.5, 0.0), (0.5, 0.3), (3.0, 0.6), (0.1, 0.9)):
        got = cache.cache_argmax_correct(hidden, log_probs, labels, valid, theta, lam)
        want = [naive_mixture_argmax(hidden, log_probs, labels, valid, theta, lam, t) == int(labels[t])
                for t in range(n)]
        assert got.tolist() == want, (theta, lam)
        checked += sum(want)
    assert 0 < checked < 4 * n  # both outcomes occur


def test_tune_picks_the_grid_minimum_and_keeps_lambda_zero_when_the_cache_cannot_help():
    g = torch.Generator().manual_seed(5)
    span = torch.randint(0, 50, (20,), generator=g)
    labels = torch.cat([span, span])  # a repeated span: the cache knows the second half
    hidden = torch.nn.functional.one_hot(torch.cat([span, span]), 50).double() * 3.0  # h_t = h_i on a repeat
    valid = torch.ones(40, dtype=torch.bool)
    weak = torch.full((40,), math.log(1 / 50), dtype=torch.float64)
    segments = [(hidden, labels, valid, weak, torch.zeros(40, dtype=torch.long))]
    lam, theta, loss = cache.tune(cache.collect(segments, cache.theta_grid(9.0)))
    assert lam > 0 and loss < -float(weak.mean())
    brute = min(float(-cache.mix_target_log_probs(weak, cache.cache_target_log_probs(hidden, labels, valid, th)[0],
                                                   cache.cache_target_log_probs(hidden, labels, valid, th)[1], la).mean())
                for th in cache.theta_grid(9.0) for la in cache.LAMBDAS)
    assert loss == pytest.approx(brute, abs=1e-12)
    perfect = torch.zeros(40, dtype=torch.float64)  # the model already puts probability 1 on every label
    lam0, _, loss0 = cache.tune(cache.collect([(hidden, labels, valid, perfect, torch.zeros(40, dtype=torch.long))],
                                              cache.theta_grid(9.0)))
    assert lam0 == 0.0 and loss0 == 0.0


def test_document_bootstrap_intervals():
    nll, count = [10.0, 20.0, 30.0, 5.0], [10, 10, 10, 10]
    low, high = bootstrap_ratio_ci(nll, count)
    assert low < sum(nll) / sum(count) < high and low >= 0.5 and high <= 3.0
    diff, dlow, dhigh = bootstrap_paired_ci([x - 1 for x in nll], nll, count)
    assert diff == pytest.approx(-0.1) and dlow == pytest.approx(-0.1) and dhigh == pytest.approx(-0.1)  # constant


def test_cache_task_on_a_trained_model(megatron, packed_val: Path, isolated_streaming):
    """Tuned on the split it is scored on (dev = val here), the cache can only lower the loss (lambda = 0 is in the
    grid); the model's loss over the task's positions is `val`'s; bad input names the fix."""
    scorer = megatron["baseline"]
    opts = EvalOptions(batch_size=4, show_progress=False, data=str(packed_val), dev_data=str(packed_val))
    result = cache_task.run(scorer, opts)
    plain = val.run(scorer, opts)
    m = result.metrics
    # same fp32 per-token log-probs, reduced in another order in float64: 1e-6 relative
    assert m["model_val_loss"] == pytest.approx(plain.metrics["val_loss"], rel=1e-6)
    assert m["cache_val_loss"] <= m["model_val_loss"] + 1e-12
    assert m["cache_val_loss_ci_low"] <= m["cache_val_loss"] <= m["cache_val_loss_ci_high"]
    assert m["cache_minus_model_ci_low"] <= m["cache_minus_model"] <= 1e-12
    assert m["cache_lambda"] in cache.LAMBDAS and result.details["tokens"] == plain.details["tokens"]
    assert plain.details["sequences"] == plain.details["samples_available"]  # every sample, not a prefix
    assert plain.metrics["val_loss_ci_low"] < plain.metrics["val_loss"] < plain.metrics["val_loss_ci_high"]
    with pytest.raises(ValueError, match="--dev-data DIR"):
        cache_task.run(scorer, EvalOptions(batch_size=4, show_progress=False, data=str(packed_val)))


def test_spamlang_cache_control_on_a_trained_baseline(megatron):
    """SpamLang's cache control: from position 1 on every cache entry carries the repeated symbol (p_cache = 1 on it),
    so NLL tuning takes the largest lambda and the baseline + cache is right at >= (L - 1) / L of the positions."""
    from cplm_megatron.evaluation.tasks import spamlang

    m = spamlang.run(megatron["baseline"], EvalOptions(batch_size=4, limit=4, spamlang_length=32,
                                                       show_progress=False)).metrics
    assert m["spamlang_cache_lambda"] == max(cache.LAMBDAS) and m["spamlang_accuracy_cache"] >= 31 / 32
    assert m["spamlang_loss_cache"] < m["spamlang_loss"] and m["spamlang_accuracy_previous_token"] == 1.0
