"""Scorers: Megatron log-probs are the model's distribution, the untrained model is the trainer's
starting point, and a checkpoint and its HF export give the same numbers."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cplm_megatron.data.synthetic import copy_sample, make_batch
from cplm_megatron.evaluation.metrics import target_log_probs
from cplm_megatron.evaluation.options import EvalOptions
from cplm_megatron.evaluation.runner import evaluate
from cplm_megatron.evaluation.scorers import (
    MegatronScorer,
    document_segments,
    single_process_megatron,
)
from cplm_megatron.evaluation.tasks import val
from tests.evaluation.runs import LR, VOCAB

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

# fp32 log-probs of two independent implementations (Megatron vs HF modules) of a hidden-64 model with a 512-token
# vocabulary: other summation orders in every matmul and softmax plus separately computed RoPE tables give ~1e-5
# relative on |log p| <~ 10 -> 1e-4
BACKEND_ATOL = 1e-4


def copy_batch(n: int = 4, length: int = 64) -> dict:
    return make_batch([copy_sample(i, length, VOCAB, seed=3)[0] for i in range(n)])


def test_document_segments_split_rows_at_document_changes():
    batch = {"tokens": torch.zeros(2, 6, dtype=torch.long),
             "document_ids": torch.tensor([[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0]])}
    assert document_segments(batch) == [(0, 0, 2), (0, 2, 5), (0, 5, 6), (1, 0, 6)]
    assert document_segments({"tokens": torch.zeros(1, 3)}) == [(0, 0, 3)]


@pytest.mark.parametrize("name", ["baseline", "cplm"])
def test_megatron_log_probs_are_normalized_and_match_the_training_loss(megatron, name):
    scorer = megatron[name]
    batch = copy_batch()
    log_probs = scorer.log_probs(batch)
    assert log_probs.shape == (4, 64, VOCAB)
    # fp32 logsumexp over 512 entries: ~sqrt(512) * 2^-24 ~ 1.3e-6, plus the rounding of |log p| <~ 10 -> 1e-5
    assert torch.allclose(torch.logsumexp(log_probs, dim=-1), torch.zeros(4, 64), atol=1e-5)
    with torch.no_grad():
        loss = scorer.model(**scorer.model_inputs(batch), output="loss")  # the training objective's code path
    # the same fp32 log p(y) from the scorer's and the training objective's code paths (|log p| <~ 10): 1e-5
    assert torch.allclose(-target_log_probs(log_probs, batch["labels"]), loss, atol=1e-5)
    assert scorer.has_copy_head == (name == "cplm")
    assert scorer.config.copy_head.enabled == (name == "cplm") and scorer.iteration == 2


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)
            and v.is_floating_point()}


def test_initial_model_is_where_training_started(runs: dict[str, Path]):
    """An AdamW step moves each weight by at most its lr (Megatron's warmup makes the first lr 0): the
    rebuilt init must be within LR of step 1 and of step 2 (yet differ from step 2, which moved), and
    baseline and CPLM start from the same backbone."""
    with single_process_megatron():
        initial = {name: _params(MegatronScorer.initial(run).model) for name, run in runs.items()}
        steps = {(name, it): _params(MegatronScorer.load(run / "checkpoints" / f"iter_000000{it}").model)
                 for name, run in runs.items() for it in (1, 2)}
    for name in runs:
        distance = {it: max(float((initial[name][k] - steps[name, it][k]).abs().max()) for k in initial[name])
                    for it in (1, 2)}
        # AdamW moves a weight by at most lr per step (|m / sqrt(v)| <= 1); the 1% margin is for rounding the
        # updated fp32 weight (half an ulp, ~1e-9 at |w| ~ 0.02, next to LR = 1e-6)
        assert distance[1] <= LR * 1.01 and 0 < distance[2] <= 2 * LR * 1.01, (name, distance)
    backbone = {k for k in initial["cplm"] if not k.startswith("copy_head.")}
    assert backbone == set(initial["baseline"])
    # bitwise: the same seed initializes the same backbone tensors
    assert all(torch.equal(initial["cplm"][k], initial["baseline"][k]) for k in backbone)


@pytest.mark.parametrize("name", ["baseline", "cplm"])
def test_hf_export_gives_the_same_log_probs(megatron, hf, name):
    batch = copy_batch()
    assert hf[name].has_copy_head == (name == "cplm")
    torch.testing.assert_close(hf[name].log_probs(batch), megatron[name].log_probs(batch), atol=BACKEND_ATOL, rtol=0)


def test_hf_scores_packed_documents_like_megatron(megatron, hf, packed_val: Path, isolated_streaming):
    """Rows holding several documents: the HF scorer runs each document alone, Megatron masks them."""
    loader = val.open_val_loader([str(packed_val)], 4, True, VOCAB)
    batch = next(iter(loader))
    assert int(batch["document_ids"].max()) >= 2
    mask = batch["loss_mask"].bool()
    for name in ("baseline", "cplm"):
        got, want = hf[name].log_probs(batch), megatron[name].log_probs(batch)
        torch.testing.assert_close(got[mask], want[mask], atol=BACKEND_ATOL, rtol=0)


@pytest.mark.parametrize("name", ["baseline", "cplm"])
def test_every_task_agrees_across_backends(megatron, hf, packed_val: Path, isolated_streaming, name):
    opts = EvalOptions(batch_size=4, limit=4, data=str(packed_val), copy_length=64, spamlang_length=32,
                       passkey_lengths=(32, 64), passkey_depths=(0.0, 1.0), gradient_source="val", show_progress=False)
    tasks = ["val", "copy", "passkey", "spamlang", "gradient"]
    got, want = evaluate(hf[name], tasks, opts), evaluate(megatron[name], tasks, opts)
    for task in tasks:
        for metric, value in want["tasks"][task]["metrics"].items():
            # metrics computed from log-probs that agree within BACKEND_ATOL: 1e-4 relative (accuracies: exact)
            # (nan_ok: a figure undefined for the model, e.g. the copy/LM gradient cosine of a baseline, on both)
            assert got["tasks"][task]["metrics"][metric] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), (
                task, metric)
