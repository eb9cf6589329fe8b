"""The planner's time estimate (cplm_megatron/model/sizing/step_time.py) and the rule it sets for the layout of the long-context
recipe: among the layouts that fit, the least model parallelism, then at equal degree the one that moves fewer bytes
(for SmolLM2-1.7B at 32k, CP=2 moves fewer than TP=2, but only TP=2 fits 8 x 80 GB with Megatron's logits)."""
from dataclasses import replace

import pytest

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.sizing.accounting import GIB, CopyHeadShape, memory_estimate
from cplm_megatron.model.sizing.planner import plan_layouts
from cplm_megatron.model.sizing.step_time import communication_bytes, micro_batch_seconds, seconds_per_sequence
from cplm_megatron.run_config import load_run_config
from tests.training.pretrain_utils import REPO

RECIPE_32K = REPO / "configs/smollm2_1p7b_32k.yaml"
USABLE_80GB = 80e9 / GIB * 0.9  # tools/model_info.py --gpu-memory 80GB with its default 10% reserve


def test_communication_bytes_count_the_collectives():
    """TP with SP: 4 collectives of the local [T/cp, h] per layer and pass, each sending (tp-1)/tp of it; CP: the
    K/V of the whole sequence gathered ((cp-1)/cp of it sent) and their gradients reduce-scattered; full
    recomputation re-runs both, selective only core attention (CP's gather)."""
    m, seq = load_preset("smollm2-1.7b"), 4096
    h, kv, layers = m.hidden_size, 2 * m.kv_heads * m.head_dim * 2, m.num_layers
    tp2 = communication_bytes(m, None, seq, 1, tp=2, cp=1, pp=1)
    assert tp2 == {"tp": pytest.approx(layers * 2 * 4 * 0.5 * seq * h * 2), "cp": 0}
    cp2 = communication_bytes(m, None, seq, 1, tp=1, cp=2, pp=1)
    assert cp2 == {"tp": 0, "cp": pytest.approx(layers * 2 * 0.5 * seq * kv)}
    both = communication_bytes(m, None, seq, 1, tp=2, cp=2, pp=1)
    assert both["tp"] == pytest.approx(tp2["tp"] / 2) and both["cp"] == pytest.approx(cp2["cp"] / 2)
    full = communication_bytes(m, None, seq, 1, tp=2, cp=2, pp=1, recompute="full")
    selective = communication_bytes(m, None, seq, 1, tp=2, cp=2, pp=1, recompute="selective")
    assert full["tp"] == pytest.approx(1.5 * both["tp"]) and full["cp"] == pytest.approx(1.5 * both["cp"])
    assert selective["tp"] == pytest.approx(both["tp"]) and selective["cp"] == pytest.approx(full["cp"])
    head = CopyHeadShape(4, 64)
    assert communication_bytes(m, head, seq, 1, 1, 2, 1)["cp"] - cp2["cp"] == pytest.approx(0.5 * seq * (2 * 256 * 2 + 16))
    # a GQA model gathers only its key/value groups: 8 groups of 32 heads move a quarter of MHA's
    mha = load_preset("llama-7b")
    gqa = replace(mha, num_query_groups=8)
    assert communication_bytes(gqa, None, seq, 1, 1, 2, 1)["cp"] == pytest.approx(
        communication_bytes(mha, None, seq, 1, 1, 2, 1)["cp"] / 4)


def test_time_is_the_flops_share_plus_the_traffic():
    m, c, seq = load_preset("smollm2-1.7b"), CopyHeadShape(4, 64), 32768
    one = micro_batch_seconds(m, c, seq, 1, tp=1, cp=1, pp=1)
    assert one["tp"] == one["cp"] == 0 and one["total"] == one["compute"]
    for tp, cp in ((2, 1), (1, 2), (2, 2)):
        t = micro_batch_seconds(m, c, seq, 1, tp=tp, cp=cp, pp=1)
        assert t["compute"] == pytest.approx(one["compute"] / (tp * cp))  # no layout adds FLOPs
        assert t["total"] == pytest.approx(t["compute"] + t["tp"] + t["cp"])
    # per sequence of the node: dp replicas side by side
    assert seconds_per_sequence(m, c, seq, 2, 2, 1, 1, dp=4) == pytest.approx(
        micro_batch_seconds(m, c, seq, 2, 2, 1, 1)["total"] / 8)


def test_the_32k_recipe_follows_the_planners_rule():
    """SmolLM2-1.7B at 32k on 8 x 80 GB with Megatron's logits: TP=2 and TP=2 x CP=2 fit; degree 1 (DP=8) does
    not, nor CP=2 (by 1.3 GiB). The planner picks TP=2 with SP, and the recipe sets it. TP=2 x CP=2 needs least
    memory and communicates most per sequence (two model-parallel splits of one replica)."""
    cfg = load_run_config(str(RECIPE_32K))
    m, c = load_preset(cfg.model.preset), CopyHeadShape.of(cfg.copy_head)
    seq, mb = cfg.train.seq_len, cfg.train.micro_batch
    rows = plan_layouts(m, c, 8, seq, mb, USABLE_80GB, 2, "sdpa", cfg.data.document_masking)
    best = [r for r in rows if r["fits"]][0]
    assert (best["tp"], best["pp"], best["cp"], best["sp"]) == (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp,
                                                                  cfg.parallel.sp) == (2, 1, 1, True)
    assert cfg.validate_world(8) == best["dp"] == 4
    plain = {(r["tp"], r["cp"]): r for r in rows
             if (r["pp"], r["recompute"], r["lm_head_loss"], r["offload_fraction"]) == (1, "none", "megatron", 0.0)}
    assert not plain[1, 1]["fits"] and not plain[1, 2]["fits"] and all(plain[k]["fits"] for k in ((2, 1), (2, 2)))
    time = {k: plain[k]["seconds_per_sequence"] for k in ((2, 1), (1, 2), (2, 2))}
    memory = {k: plain[k]["total_gib"] for k in time}
    assert time[1, 2] < time[2, 1] < time[2, 2]
    assert memory[2, 2] < memory[2, 1] < USABLE_80GB < memory[1, 2]
    assert memory[2, 1] == pytest.approx(memory_estimate(m, c, tp=2, dp=4, sp=True, seq_len=seq, micro_batch=mb)[
        "total_distributed_optimizer_gib"])
    # the rule, on the whole plan: no offload, fewest extra FLOPs, least model parallelism, no pipeline, fastest
    key = [(r["offload_fraction"], round(r["extra_flops_pct"], 6), r["tp"] * r["pp"] * r["cp"], r["pp"],
            r["seconds_per_sequence"]) for r in rows]
    assert key == sorted(key)
