"""benchmarks/gpu/study_step.py's bookkeeping (its run is checked by `make gpu-dry-run STEPS=study`): both arms train
on the same settings but the copy head, the GPU sizes are the stated token budget, the controls are named from the
evaluation's metrics, and CPLM - baseline pairs the same validation documents."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "study_step.py"
spec = importlib.util.spec_from_file_location("study_step", SCRIPT)
study_step = importlib.util.module_from_spec(spec)
sys.modules["study_step"] = study_step  # its dataclasses look their module up
spec.loader.exec_module(study_step)


def test_the_arms_differ_only_in_the_copy_head_and_the_baseline_stops_at_the_cplms_count():
    base, cplm = (study_step.train_overrides(arm, study_step.GPU, Path("/c"), Path("/r"), 8192,
                                             exit_after=700 if arm == "baseline" else None)
                  for arm in ("baseline", "cplm"))
    assert [a for a, b in zip(base, cplm) if a != b] == ["copy_head.enabled=false"]
    assert base[len(cplm):] == ["train.exit_after_iters=700"] and len(base) == len(cplm) + 1
    assert "data.streams=[/c/train]" in base and "model.vocab_size=8192" in base and "schedule.style=constant" in base
    assert "train.probe_interval=100" in base and "model.hidden_size=256" in base and "model.num_layers=4" in base


def test_the_shape_trains_about_1e8_tokens_per_arm_by_the_fit_to_the_measured_h200_runs():
    """The throughput fit reproduces both measured runs it is solved from; by it each arm of the study's model trains
    ~1e8 tokens in its longest share (an estimate, to be measured on the next lease), and the study's budget holds
    both shares and the scoring reserve."""
    from dataclasses import replace

    from cplm_megatron.model.config import load_preset

    for preset, seq, measured in study_step.MEASURED:
        model = replace(load_preset(preset), max_position_embeddings=max(seq, 2048))
        assert study_step.estimated_tokens_per_sec(model, None, seq) == pytest.approx(measured, rel=1e-9)
    est = study_step.estimate(study_step.GPU, 8192)
    assert est["tokens_per_sec_h200"]["cplm"] < est["tokens_per_sec_h200"]["baseline"]
    assert 0.7e8 <= est["tokens_in_max_arm_share"] <= 1.5e8, est
    gpu = study_step.GPU
    assert 2 * gpu.max_arm_seconds + gpu.score_reserve_s <= 240


def test_the_docs_candidate_table_is_the_estimate():
    """docs/gpu-check.md's candidate shapes (training MFLOP/token, estimated tokens/s, tokens in an arm's share of
    the lease's study) are study_step.estimate's, to the digits printed; the study's own shape is among them."""
    import re

    page = (Path(study_step.__file__).resolve().parents[2] / "docs" / "gpu-check.md").read_text()
    rows = re.findall(r"^\| (\d+) x (\d+)( \(the study's\))? \| ([\d.]+) \| ([\d.]+)M \| ([\d.e]+) \|$", page, re.M)
    est = study_step.estimate(study_step.GPU, 8192)
    assert len(rows) == len(est["candidates"]) == len(study_step.CANDIDATES)
    for (layers, width, mark, mflop, speed, tokens), row in zip(rows, est["candidates"]):
        assert (int(layers), int(width), bool(mark)) == (row["layers"], row["width"], row["study"])
        assert float(mflop) == row["train_mflop_per_token"]
        assert float(speed) == round(row["tokens_per_sec_h200"] / 1e6, 2)
        assert tokens == f"{row['tokens_in_lease_share']:.1e}".replace("e+0", "e")
    assert f"tokens in {study_step.LEASE_SHARE_S} s" in page


def test_a_time_share_waits_for_the_trainers_handler():
    """The share's stop signal goes out only once a handler is installed: a start-up longer than the share still
    gets its stop (not the iteration cap), and cancelled before the share ends it sends nothing."""
    import signal

    got = []
    with study_step.TimeShare(0.05, poll_s=0.01) as share:
        time.sleep(0.3)  # "start-up": the signal is ignored meanwhile, and not sent
        assert not share.fired and not got
        signal.signal(signal.SIGUSR1, lambda *_: got.append(time.monotonic()))
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    assert share.fired and len(got) == 1
    with study_step.TimeShare(30) as early:
        pass
    assert not early.fired and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


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
