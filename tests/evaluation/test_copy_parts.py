"""The copy task's copy-head-alone accuracy and mean gate: p_copy and g recompose the model's own mixture."""
from __future__ import annotations

import pytest
import torch

from cplm_megatron.data.synthetic import copy_sample, make_batch
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.scorers import HFScorer, hidden_and_log_probs, lm_head_log_probs
from cplm_megatron.evaluation.tasks import copy
from tests.evaluation.runs import VOCAB


def recomposed(scorer, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """((1 - g) p_LM + g p_copy, exp(the model's mixture log-probs)) [b, s, V]."""
    log_probs, p_copy, gate = copy.copy_parts(scorer, batch)
    hidden, _ = hidden_and_log_probs(scorer, batch)
    p_lm = lm_head_log_probs(scorer, hidden).exp()
    g = gate[..., None]
    return (1 - g) * p_lm + g * p_copy, log_probs.exp()


def check(scorer, batch) -> None:
    mixed, model = recomposed(scorer, batch)
    # fp32 probabilities from the same weights by two routes: log-space mixing vs a probability sum, ~1e-7 each
    torch.testing.assert_close(mixed, model, rtol=1e-4, atol=1e-6)


def test_megatron_copy_parts_recompose_the_mixture(megatron):
    batch = make_batch([copy_sample(i, 64, VOCAB, seed=5)[0] for i in range(2)])
    check(megatron["cplm"], batch)
    result = copy.run(megatron["cplm"], EvalOptions(batch_size=2, limit=4, copy_length=64, show_progress=False))
    assert 0 <= result.metrics["copy_head_accuracy"] <= 1 and 0 < result.metrics["copy_mean_gate"] < 1
    base = copy.run(megatron["baseline"], EvalOptions(batch_size=2, limit=4, copy_length=64, show_progress=False))
    assert "copy_head_accuracy" not in base.metrics


@pytest.mark.parametrize("mixing", ["gate", "sentinel"])
def test_hf_copy_parts_recompose_the_mixture(mixing):
    from tests.hf.hf_testing import cplm_config, tiny_cplm

    scorer = HFScorer(tiny_cplm(cplm_config(copy_mixing=mixing), seed=4, gate_bias=0.5), None)
    batch = make_batch([copy_sample(i, 32, 300, seed=5)[0] for i in range(2)])
    check(scorer, batch)
    result = copy.run(scorer, EvalOptions(batch_size=2, limit=2, copy_length=32, show_progress=False))
    assert 0 <= result.metrics["copy_head_accuracy"] <= 1 and 0 < result.metrics["copy_mean_gate"] < 1
