"""benchmarks/gpu/study_step.py's bookkeeping (its run is checked by `make gpu-dry-run STEPS=study`): both arms train
on the same settings but the copy head, the GPU sizes are the stated token budget, the controls are named from the
evaluation's metrics, and CPLM - baseline pairs the same validation documents."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "study_step.py"
spec = importlib.util.spec_from_file_location("study_step", SCRIPT)
study_step = importlib.util.module_from_spec(spec)
sys.modules["study_step"] = study_step  # its dataclasses look their module up
spec.loader.exec_module(study_step)


def test_the_arms_differ_only_in_the_copy_head_and_the_gpu_budget_is_stated():
    base, cplm = (study_step.train_overrides(arm, study_step.GPU, Path("/c"), Path("/r"), 49152)
                  for arm in ("baseline", "cplm"))
    assert [a for a, b in zip(base, cplm) if a != b] == ["copy_head.enabled=false"]
    assert "data.streams=[/c/train]" in base and "model.vocab_size=49152" in base and "train.iters=256" in base
    assert study_step.GPU.train_tokens == 256 * 16 * 2048 == 8_388_608


def _eval(work: Path, arm: str, nll: dict[int, float], cache: dict[int, float] | None = None) -> None:
    docs = lambda d: {"ids": list(d), "nll": list(d.values()), "count": [10] * len(d)}  # noqa: E731
    tasks = {"val": {"metrics": {"val_loss": sum(nll.values()) / (10 * len(nll))}, "details": {"documents": docs(nll)}}}
    if cache is not None:
        tasks["cache"] = {"metrics": {"cache_val_loss": 1.0, "cache_lambda": 0.1}, "details": {"documents": docs(cache)}}
    (work / f"study_eval_{arm}.json").write_text(json.dumps(tasks))


def test_comparisons_pair_the_same_documents(tmp_path: Path):
    _eval(tmp_path, "cplm", {1: 20.0, 2: 30.0, 3: 40.0})
    assert study_step.comparisons(tmp_path) == {}  # the baseline not scored yet
    _eval(tmp_path, "baseline", {3: 41.0, 1: 22.0, 2: 33.0}, cache={1: 21.0, 2: 30.0, 3: 39.0})
    out = study_step.comparisons(tmp_path)
    assert out["cplm_minus_baseline"]["val_loss"] == pytest.approx((90 - 96) / 30)
    assert out["cplm_minus_baseline_plus_cache"]["val_loss"] == pytest.approx((90 - 90) / 30)
    assert out["cplm_minus_baseline"]["documents"] == 3


def test_controls_are_named_from_the_evaluation():
    tasks = {"cache": {"metrics": {"cache_val_loss": 2.5, "cache_val_loss_ci_low": 2.4, "cache_val_loss_ci_high": 2.6,
                                   "cache_lambda": 0.2, "cache_theta": 0.5}},
             "copy": {"metrics": {"copy_accuracy": 0.1, "copy_accuracy_chance": 2e-5,
                                  "copy_accuracy_one_token_match": 0.98}},
             "passkey": {"metrics": {"passkey_first_token_accuracy": 0.0, "passkey_first_token_chance": 2e-5}}}
    controls = study_step.control_figures(tasks)
    assert controls["baseline_plus_cache"] == {"val_loss": 2.5, "val_loss_ci": [2.4, 2.6], "lambda": 0.2, "theta": 0.5}
    assert controls["copy_one_token_match_copier"]["copy_accuracy"] == 0.98
    assert controls["copy_chance"]["copy_accuracy"] == 2e-5
    assert study_step.arm_figures(tasks)["copy_accuracy"] == 0.1
