"""`model.lm_head_loss: auto` (model/lm_head_choice.py): Megatron's logits while they take at most 25% of the
device's memory and the run fits with them; the tiled loss otherwise, fused on CUDA and chunked elsewhere."""
from __future__ import annotations

import pytest

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.lm_head_choice import AUTO_LOGITS_SHARE, choose_lm_head_loss
from cplm_megatron.model.sizing.accounting import GIB, lm_head_loss_bytes

SMOLLM2_135M = load_preset("smollm2-135m")
TOKENS = 2048 * 8  # the 135M recipe's micro-batch
H200 = 139.8 * GIB


def _logits(tokens: int = TOKENS) -> float:
    """Megatron's working memory for the logits: [tokens, V] fp32 plus their bf16 copy (6 B per logit)."""
    return lm_head_loss_bytes(SMOLLM2_135M, tokens, 1, "megatron", 2)["peak"]


def test_the_logits_are_what_the_rule_weighs():
    assert _logits() == pytest.approx(TOKENS * 49152 * 6)  # 4.5 GiB at 135M, seq 2048, micro 8


def test_megatron_while_the_logits_are_a_small_share_of_the_device():
    choice = choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, H200, "an H200", on_cuda=True)
    assert choice.path == "megatron" and "3.2% of an H200" in choice.reason


@pytest.mark.parametrize("on_cuda, tiled", [(True, "fused"), (False, "chunked")])
def test_the_tiled_loss_above_the_share(on_cuda, tiled):
    device = _logits() / (AUTO_LOGITS_SHARE * 1.01)  # the logits take just over the share
    assert choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, device, "d", on_cuda).path == tiled
    at_share = _logits() / AUTO_LOGITS_SHARE
    assert choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, at_share, "d", on_cuda).path == "megatron"


def test_the_tiled_loss_where_only_it_fits():
    fits_only_tiled = {"megatron": False, "fused": True, "chunked": True}
    choice = choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, H200, "d", True, fits=fits_only_tiled.get)
    assert choice.path == "fused" and "fits only without them" in choice.reason
    nothing_fits = {"megatron": False, "fused": False}
    assert choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, H200, "d", True, fits=nothing_fits.get).path == "megatron"


def test_tensor_parallel_splits_the_logits():
    device = 1.5 * _logits() / (AUTO_LOGITS_SHARE * 2)  # over the share at tp=1, under it at tp=2 (V/2 per GPU)
    assert choose_lm_head_loss(SMOLLM2_135M, TOKENS, 1, 2, device, "d", True).path == "fused"
    assert choose_lm_head_loss(SMOLLM2_135M, TOKENS, 2, 2, device, "d", True).path == "megatron"


def test_auto_keeps_a_reserve():
    """The 1.7B at seq 4096, micro-batch 4 (the planner: 78.99 GiB, Megatron's logits; 74.75 GiB tiled) on an H100's
    79.6 GiB: without a reserve both "fit" and auto kept Megatron's logits, a likely out-of-memory error. With the
    planner's estimate times the measured margin inside 90% of the memory neither fits; on 86 GiB only the tiled
    loss does, and auto takes it; on an H200 Megatron's path fits."""
    from dataclasses import replace

    from cplm_megatron.model.lm_head_choice import run_fits
    from cplm_megatron.model.sizing.accounting import memory_estimate

    model = replace(load_preset("smollm2-1.7b"), max_position_embeddings=4096)

    def needed(path: str) -> float:
        return memory_estimate(model, None, tp=1, pp=1, dp=1, seq_len=4096, micro_batch=4,
                               lm_head_loss=path)["total_gib"] * GIB

    assert needed("megatron") == pytest.approx(78.99 * GIB, rel=1e-3) and needed("megatron") < 79.65 * GIB
    assert not run_fits(needed("megatron"), 79.65 * GIB) and not run_fits(needed("fused"), 79.65 * GIB)
    choice = choose_lm_head_loss(model, 4 * 4096, 1, 2, 86 * GIB, "d", True, needed=needed)
    assert choice.path == "fused" and "fits only without them" in choice.reason
    assert choose_lm_head_loss(model, 4 * 4096, 1, 2, H200, "d", True, needed=needed).path == "megatron"
