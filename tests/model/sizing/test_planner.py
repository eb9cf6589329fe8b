"""The layout planner (cplm_megatron/model/sizing/planner.py): every layout of a node, the least costly fitting one first
(no offload, no extra FLOPs, the least model parallelism), the fused LM-head loss where Megatron's logits do not
fit, context-parallel layouts only with an attention that supports them."""
import pytest

from cplm_megatron.model.config import load_preset
from cplm_megatron.model.sizing.accounting import GIB, CopyHeadShape, memory_estimate
from cplm_megatron.model.sizing.planner import PlannedLayout, plan_layouts

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


def _measured_peaks():
    """(our runs, the peer's) on the 2026-12-04 H200 lease: (peak GiB, the current estimate GiB) per run."""
    import json
    from dataclasses import replace
    from pathlib import Path

    results = Path(__file__).resolve().parents[3] / "results" / "gpu" / "2026-12-04"

    def estimate(preset, seq, micro, loss, copy, param_bytes=2):
        model = replace(load_preset(preset), max_position_embeddings=max(seq, 2048))
        return memory_estimate(model, CopyHeadShape() if copy else None, tp=1, pp=1, dp=1, seq_len=seq,
                               micro_batch=micro, param_bytes=param_bytes, lm_head_loss=loss)["total_gib"]

    ours = [(run["peak_memory_gib"], estimate(run["preset"], run["seq_len"], run["micro_batch"], run["lm_head_loss"],
                                              run["copy_head"]))
            for slot in json.loads((results / "check_summary.json").read_text())["training"].values()
            for run in slot.values() if isinstance(run, dict)]
    for arm in ("base", "cplm"):
        for batch in ("g4", "g16"):  # 1.7B, seq 4096, micro-batch 4, Megatron's loss
            lines = (results / f"1p7b_seq4096_{arm}_{batch}.metrics.jsonl").read_text().splitlines()
            peak = max(json.loads(line).get("peak_mem_gib", 0) for line in lines)
            ours.append((peak, estimate("smollm2-1.7b", 4096, 4, "megatron", arm == "cplm")))
    peer_runs = json.loads((results / "peer_hf_seq2048.json").read_text())
    peer_runs.update(json.loads((results / "peer_hf_1p7b_seq4096.json").read_text()))
    peer = [(run["peak_memory_gib"], estimate(name.split("+")[0].removesuffix("-4k"), run["seq"], run["micro"],
                                              "megatron", False, param_bytes=4), name.split("+")[0].removesuffix("-4k"),
             run["seq"]) for name, run in peer_runs.items() if isinstance(run, dict)]
    return ours, peer


def test_the_margins_are_the_measured_peaks_over_the_estimates():
    """PEAK_MARGIN and the peer's margins come from the committed H200 figures: nine of our runs (135M and 1.7B, seq
    2048 and 4096, Megatron's and the chunked loss, with and without the copy head) and four of the transformers
    peer's (by shape), each run's peak over the planner's current estimate; each margin covers its largest ratio by
    less than 0.05 more."""
    from cplm_megatron.model.sizing.planner import PEAK_MARGIN, PEER_PEAK_MARGINS, peer_margin

    ours, peer = _measured_peaks()
    assert len(ours) == 9 and len(peer) == 4
    worst_ours = max(p / e for p, e in ours)
    assert PEAK_MARGIN - 0.05 < worst_ours <= PEAK_MARGIN, worst_ours
    for shape in PEER_PEAK_MARGINS:  # each shape's margin covers its worst run (eager or compiled) by <= 0.05
        worst = max(p / e for p, e, preset, seq in peer if (preset, seq) == shape)
        assert worst <= peer_margin(*shape) < worst + 0.05, (shape, worst)
    assert peer_margin("llama-7b", 4096) == max(PEER_PEAK_MARGINS.values())


def test_the_micro_batch_a_device_holds():
    """The 1.7B at seq 4096 (16 sequences per step, micro-batch 4 measured at 78.5 GiB on the H200): an H100 80GB
    (79.6 GiB) holds micro-batch 2, an H200 141GB (140.4 GiB) micro-batch 4; a device too small says so."""
    from dataclasses import replace

    from cplm_megatron.model.sizing.planner import PEAK_MARGIN, choose_micro_batch

    model = replace(load_preset("smollm2-1.7b"), max_position_embeddings=4096)

    def estimate(micro: int) -> float:
        return memory_estimate(model, CopyHeadShape(), tp=1, pp=1, dp=1, seq_len=4096, micro_batch=micro)["total_gib"]

    h100, h200 = (choose_micro_batch(estimate, 16, 4, mib / 1024) for mib in (81_559, 143_771))
    assert (h100.micro_batch, h100.fits, h200.micro_batch, h200.fits) == (2, True, 4, True)
    assert [m for m, _ in h100.tried] == [4, 2] and h100.tried[0][1] == pytest.approx(estimate(4) * PEAK_MARGIN)
    assert h100.needed_gib <= h100.usable_gib == pytest.approx(81_559 / 1024 * 0.9)
    small = choose_micro_batch(estimate, 16, 4, 40)
    assert (small.micro_batch, small.fits) == (1, False) and "does NOT fit" in small.line()
    assert choose_micro_batch(estimate, 6, 4, 141).micro_batch == 3  # a divisor of the batch
