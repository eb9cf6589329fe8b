"""The GPU study's scoring: the controls are named from the evaluation's metrics, and CPLM - baseline pairs the same
validation documents."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cplm_megatron.experiments.gpu_study.scoring import arm_figures, comparisons, control_figures


def _eval(work: Path, arm: str, nll: dict[int, float], cache: dict[int, float] | None = None) -> None:
    docs = lambda d: {"ids": list(d), "nll": list(d.values()), "count": [10] * len(d)}  # noqa: E731
    tasks = {"val": {"metrics": {"val_loss": sum(nll.values()) / (10 * len(nll))}, "details": {"documents": docs(nll)}}}
    if cache is not None:
        tasks["cache"] = {"metrics": {"cache_val_loss": 1.0, "cache_lambda": 0.1}, "details": {"documents": docs(cache)}}
    (work / f"study_eval_{arm}.json").write_text(json.dumps(tasks))


def test_comparisons_pair_the_same_documents(tmp_path: Path):
    _eval(tmp_path, "cplm", {1: 20.0, 2: 30.0, 3: 40.0})
    assert comparisons(tmp_path) == {}  # the baseline not scored yet
    _eval(tmp_path, "baseline", {3: 41.0, 1: 22.0, 2: 33.0}, cache={1: 21.0, 2: 30.0, 3: 39.0})
    out = comparisons(tmp_path)
    assert out["cplm_minus_baseline"]["val_loss"] == pytest.approx((90 - 96) / 30)
    assert out["cplm_minus_baseline_plus_cache"]["val_loss"] == pytest.approx((90 - 90) / 30)
    assert out["cplm_minus_baseline"]["documents"] == 3


def test_controls_are_named_from_the_evaluation():
    tasks = {"cache": {"metrics": {"cache_val_loss": 2.5, "cache_val_loss_ci_low": 2.4, "cache_val_loss_ci_high": 2.6,
                                   "cache_lambda": 0.2, "cache_theta": 0.5}},
             "copy": {"metrics": {"copy_accuracy": 0.1, "copy_accuracy_chance": 2e-5,
                                  "copy_accuracy_one_token_match": 0.98}},
             "passkey": {"metrics": {"passkey_first_token_accuracy": 0.0, "passkey_first_token_chance": 2e-5}}}
    controls = control_figures(tasks)
    assert controls["baseline_plus_cache"] == {"val_loss": 2.5, "val_loss_ci": [2.4, 2.6], "lambda": 0.2, "theta": 0.5}
    assert controls["copy_one_token_match_copier"]["copy_accuracy"] == 0.98
    assert controls["copy_chance"]["copy_accuracy"] == 2e-5
    assert arm_figures(tasks)["copy_accuracy"] == 0.1
