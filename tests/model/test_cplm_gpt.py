"""CPLMGPTModel (Megatron GPTModel + Copy-Paste head): causality, edge positions, full distribution,
the disabled head as the exact baseline, and learning SpamLang."""
import pytest
import torch

from tests.dist_utils import run_distributed
from tests.model import copy_workers as w

pytestmark = pytest.mark.slow


def test_causality_exact():
    [res] = run_distributed(w.causality, 1)
    for t, earlier_equal, later_changed in res["results"]:
        assert earlier_equal, f"loss before position {t + 1} changed when only later tokens changed"
        assert later_changed


def test_positions_without_candidates_have_zero_gate_and_lm_loss():
    [r] = run_distributed(w.no_candidate_positions, 1)
    none = ~r["has_candidate"]
    assert none[:, 0].all() and none[:, 16].all()  # sequence start and document start
    assert none[1, :9].all()  # masked history: the first candidate of row 1 is position 8
    assert (r["gate"][none] == 0).all()
    assert torch.equal(r["loss"][none], r["lm_ce"][none].float())
    assert r["has_candidate"].sum() > 0 and (r["gate"][r["has_candidate"]] > 0).all()


@pytest.mark.parametrize("tp", [1, 2])
def test_full_distribution_sums_to_one_and_matches_the_loss(tp):
    results = run_distributed(w.distribution, tp, tp)
    for r in results:
        torch.testing.assert_close(r["mass"], torch.ones_like(r["mass"]), rtol=0, atol=1e-5)
        valid = r["mask"] > 0
        torch.testing.assert_close(r["at_target"].exp()[valid], (-r["loss"][valid]).exp(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["gathered_at_target"], r["at_target"], rtol=0, atol=1e-6)
        assert r["gathered_shape"][-1] == 4096


def test_disabled_head_is_the_plain_backbone_bit_for_bit():
    [r] = run_distributed(w.disabled_is_plain_backbone, 1)
    assert r["names_equal"] and r["params_equal"] and r["n_params"] == r["n_plain"]
    assert r["loss_equal"] and r["grads_equal"]


def test_tiny_cplm_learns_spamlang():
    [r] = run_distributed(w.spamlang_learning, 1, 40)
    assert r["vocab"] >= 64 * r["hidden"]
    assert max(r["acc"]) >= 0.99, r["acc"]
    first = next(i for i, a in enumerate(r["acc"]) if a >= 0.99)
    assert first < 40, r["acc"]
