"""The GPU study's sizes (its run is checked by `make gpu-dry-run STEPS=study`): the GPU sizes are the stated token
budget by the throughput fit to the measured H200 runs, and docs/gpu-check.md's candidate table is the estimate."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from cplm_megatron.experiments.gpu_study.sizes import GPU
from cplm_megatron.experiments.gpu_study.throughput import (
    CANDIDATES,
    LEASE_SHARE_S,
    MEASURED,
    estimate,
    estimated_tokens_per_sec,
)
from cplm_megatron.model.config import load_preset

REPO = Path(__file__).resolve().parents[3]


def test_the_shape_trains_about_1e8_tokens_per_arm_by_the_fit_to_the_measured_h200_runs():
    """The throughput fit reproduces both measured runs it is solved from; by it each arm of the study's model trains
    ~1e8 tokens in its longest share (an estimate, to be measured on the next lease), and the study's budget holds
    both shares and the scoring reserve."""
    for preset, seq, measured in MEASURED:
        model = replace(load_preset(preset), max_position_embeddings=max(seq, 2048))
        assert estimated_tokens_per_sec(model, None, seq) == pytest.approx(measured, rel=1e-9)
    est = estimate(GPU, 8192)
    assert est["tokens_per_sec_h200"]["cplm"] < est["tokens_per_sec_h200"]["baseline"]
    assert 0.7e8 <= est["tokens_in_max_arm_share"] <= 1.5e8, est
    assert 2 * GPU.max_arm_seconds + GPU.score_reserve_s <= 240


def test_the_docs_candidate_table_is_the_estimate():
    """docs/gpu-check.md's candidate shapes (training MFLOP/token, estimated tokens/s, tokens in an arm's share of
    the lease's study) are throughput.estimate's, to the digits printed; the study's own shape is among them."""
    page = (REPO / "docs" / "gpu-check.md").read_text()
    rows = re.findall(r"^\| (\d+) x (\d+)( \(the study's\))? \| ([\d.]+) \| ([\d.]+)M \| ([\d.e]+) \|$", page, re.M)
    est = estimate(GPU, 8192)
    assert len(rows) == len(est["candidates"]) == len(CANDIDATES)
    for (layers, width, mark, mflop, speed, tokens), row in zip(rows, est["candidates"]):
        assert (int(layers), int(width), bool(mark)) == (row["layers"], row["width"], row["study"])
        assert float(mflop) == row["train_mflop_per_token"]
        assert float(speed) == round(row["tokens_per_sec_h200"] / 1e6, 2)
        assert tokens == f"{row['tokens_in_lease_share']:.1e}".replace("e+0", "e")
    assert f"tokens in {LEASE_SHARE_S} s" in page
