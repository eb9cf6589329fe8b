"""The layout planner (cplm_megatron/model/planner.py): every layout of a node, the least costly fitting one first
(no offload, no extra FLOPs, the least model parallelism), the fused LM-head loss where Megatron's logits do not
fit, context-parallel layouts only with an attention that supports them."""
import pytest

from cplm_megatron.model.accounting import GIB, CopyHeadShape, memory_estimate
from cplm_megatron.model.config import load_preset
from cplm_megatron.model.planner import PlannedLayout, plan_layouts

pytestmark = pytest.mark.mcore  # layout_valid builds megatron's layout checks


def test_planner_on_one_8_gpu_node():
    usable = 80e9 / GIB * 0.9
    for preset, seq in (("smollm2-1.7b", 2048), ("llama-7b", 4096), ("llama-13b", 4096)):
        m = load_preset(preset)
        rows = plan_layouts(m, None, 8, seq, 1, usable)
        fitting = [r for r in rows if r["fits"]]
        assert fitting, preset
        best = fitting[0]
        assert best["offload_fraction"] == 0 and best["extra_flops_pct"] == 0, (preset, best)
        assert all(r["tp"] * r["pp"] * r["cp"] * r["dp"] == 8 for r in rows)
        if preset == "llama-13b":  # 13B weights + fp32 grads alone (6 B/param) exceed one GPU
            assert not any(r["fits"] for r in rows if r["tp"] * r["pp"] == 1)
    m = load_preset("smollm2-1.7b")
    assert plan_layouts(m, None, 8, 2048, 1, usable)[0]["tp"] == 1  # no model parallelism needed


def test_planner_prefers_the_fused_loss_where_megatron_logits_do_not_fit():
    m = load_preset("llama-7b")
    seq, mb = 8192, 2
    megatron = memory_estimate(m, tp=1, pp=1, dp=8, seq_len=seq, micro_batch=mb, lm_head_loss="megatron")
    fused = memory_estimate(m, tp=1, pp=1, dp=8, seq_len=seq, micro_batch=mb, lm_head_loss="fused")
    gap = megatron["total_distributed_optimizer_gib"] - fused["total_distributed_optimizer_gib"]
    assert gap == pytest.approx(megatron["lm_head_loss_gib"] - fused["lm_head_loss_gib"])
    usable = fused["total_distributed_optimizer_gib"] + gap / 2  # between the two
    rows = plan_layouts(m, None, 8, seq, mb, usable)
    single = {(r["lm_head_loss"], r["recompute"], r["offload_fraction"]): r["fits"]
              for r in rows if (r["tp"], r["pp"], r["cp"]) == (1, 1, 1)}
    assert single[("fused", "none", 0.0)] and not single[("megatron", "none", 0.0)]
    assert PlannedLayout(2, 1, 4).sp and not PlannedLayout(1, 2, 4).sp


def test_context_parallel_layouts_split_the_node_and_need_an_attention_that_supports_them():
    m, c, seq = load_preset("smollm2-1.7b"), CopyHeadShape(4, 64), 32768
    rows = plan_layouts(m, c, 8, seq, 1, 80e9 / GIB * 0.9)
    assert {r["cp"] for r in rows} == {1, 2, 4, 8}
    assert all(r["tp"] * r["pp"] * r["cp"] * r["dp"] == 8 for r in rows)
    assert not any(r["cp"] > 1 for r in plan_layouts(m, c, 8, seq, 1, 67.0, attention="megatron"))
