"""The recipe study's aggregation: efficiency, mean/std, paired differences, the decision rule, the tables."""
import statistics

import pytest

from cplm_megatron.experiments.records import RunResults
from cplm_megatron.experiments.run import Evaluation, Run
from cplm_megatron.experiments.study.plan import GLOBAL_BATCH, SEQ_LEN
from cplm_megatron.experiments.study.report import headline_table, readme_block
from cplm_megatron.experiments.study.summary import summarize, tokens_to_reach
from cplm_megatron.model.sizing.accounting import CopyHeadShape, train_flops_figures
from cplm_megatron.run_config import load_run_config
from cplm_megatron.training.run_record import Layout, RunRecord

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

TOKENS_PER_STEP = GLOBAL_BATCH * SEQ_LEN


def _run(scale: str, arm: str, seed: int, losses: list[float], lm_losses: list[float] | None = None,
         copy: float = 0.0, layers: int = 4, interval: int = 100) -> RunResults:
    iters = interval * len(losses)
    labels = {"arm": arm, "scale": scale, "seed": seed, "hidden": 64 * layers // 4, "layers": layers, "vocab": 4096,
              "iters": iters, "copy_head": arm != "baseline"}
    spec = Run(f"{scale}-{arm}-s{seed}", f"{scale}-s{seed}", (("copy_head.enabled", arm != "baseline"),),
               Evaluation(("val",), every_checkpoint=False), tuple(sorted(labels.items())), experiment="study")
    lm_losses = lm_losses or losses
    metrics = [{"iteration": interval * (i + 1), "val_loss": v, "val_lm_loss": lm}
               for i, (v, lm) in enumerate(zip(losses, lm_losses))]
    grid = [{"length": 64, "depth": 0.5, "accuracy": copy, "token_accuracy": copy},
            {"length": 256, "depth": 0.5, "accuracy": copy / 2, "token_accuracy": copy / 2}]
    final = {"iteration": iters, "tasks": {
        "copy": {"metrics": {"copy_accuracy": copy}},
        "passkey": {"metrics": {"passkey_accuracy": copy * 0.75, "passkey_token_accuracy": copy * 0.75},
                    "details": {"lengths": [64, 256], "grid": grid}},
        "gradient": {"metrics": {"logit_grad_outside_span": 0.98, "copy_grad_share": 0.5 if copy else 0.0}}}}
    if arm == "baseline":  # the cache control runs on the baseline's checkpoint
        final["tasks"]["cache"] = {"metrics": {"cache_val_loss": losses[-1] - 0.1, "cache_val_loss_ci_low": 0.0,
                                               "cache_val_loss_ci_high": 9.0, "cache_lambda": 0.1, "cache_theta": 0.5}}
    return RunResults(spec, metrics, [final], _record(spec, iters))


def _record(spec: Run, iters: int) -> RunRecord:
    """The run record the trainer writes for this run's config (its FLOPs per token; the rest is not read)."""
    cfg = load_run_config(spec.recipe, spec.overrides())
    flops = train_flops_figures(cfg.model, cfg.train.seq_len, CopyHeadShape.of(cfg.copy_head))
    return RunRecord(preset=cfg.model.preset, copy_head=cfg.copy_head.enabled, layout=Layout(1, 1, 1, None, False, 1),
                     nodes=1, device="cpu", seq_len=cfg.train.seq_len, global_batch=cfg.train.global_batch,
                     iterations=iters, tokens_per_sec=None, tflops_per_device=None, mfu=None, step_time=None,
                     peak_memory_gib=0.0, config_hash="", **flops)


def test_tokens_to_reach_interpolates_between_evaluations():
    curve = [(100, 6.0), (200, 5.0), (300, 4.0)]
    # fp64 arithmetic of a few operations: pytest.approx's default rel 1e-6 is far above its rounding (~1e-16)
    assert tokens_to_reach(curve, 4.5) == pytest.approx(250 * TOKENS_PER_STEP)
    assert tokens_to_reach(curve, 6.5) == 100 * TOKENS_PER_STEP  # already reached at the first evaluation
    assert tokens_to_reach(curve, 3.9) is None


def _study(arm_offsets: dict[str, list[float]], scales=("tiny", "small"), seeds=(1, 2, 3)) -> list[RunResults]:
    """Baselines 6 -> 5 -> 4 (last: 4.0; the cache control 3.9); arm curves shifted per seed by the given offsets."""
    runs = []
    for scale in scales:
        layers = 4 if scale == "tiny" else 8
        for seed_index, seed in enumerate(seeds):
            runs.append(_run(scale, "baseline", seed, [6.0, 5.0, 4.0], layers=layers))
            for arm, offsets in arm_offsets.items():
                d = offsets[seed_index]
                runs.append(_run(scale, arm, seed, [6.0 + d, 5.0 + d, 4.0 + d], lm_losses=[7.0, 6.0, 5.0],
                                 copy=0.4, layers=layers))
    return runs


def test_summary_paired_differences_efficiency_and_spread():
    summary = summarize(_study({"aux1": [-0.5, -0.3, -0.1], "mixture": [0.2, -0.1, 0.1]}))
    aux = summary["scales"]["tiny"]["arms"]["aux1"]
    # fp64 means, standard deviations and ratios of a few numbers: pytest.approx's default rel 1e-6 (below as well)
    assert aux["mean_std"]["val_loss"]["mean"] == pytest.approx(4.0 - 0.3)
    assert aux["mean_std"]["val_loss"]["std"] == pytest.approx(0.2)  # sample std of -0.5, -0.3, -0.1
    paired = aux["paired_vs_baseline"]["val_loss"]
    assert paired["per_seed"] == pytest.approx({"1": -0.5, "2": -0.3, "3": -0.1})
    assert (paired["better_in"], paired["seeds"]) == (3, 3)
    # seed 1: 4.5 at step 200, 3.5 at 300 -> reaches 4.0 at step 250 of the baseline's 300
    assert aux["per_seed"]["1"]["efficiency"] == pytest.approx(250 / 300)
    assert aux["mean_std"]["lm_val_loss"]["mean"] == pytest.approx(5.0)
    assert aux["passkey_by_length"]["256"]["accuracy"]["mean"] == pytest.approx(0.2)
    mixture = summary["scales"]["tiny"]["arms"]["mixture"]["paired_vs_baseline"]["val_loss"]
    assert mixture["better_in"] == 1
    assert summary["scales"]["tiny"]["arms"]["mixture"]["per_seed"]["1"]["efficiency"] is None  # never reaches 4.0
    base = summary["scales"]["tiny"]["arms"]["baseline"]["mean_std"]["efficiency"]
    assert base["mean"] == pytest.approx(1.0)
    flat = summary["scales"]["tiny"]["baseline_flattening"]
    assert flat["relative_improvement_last_quarter"] == pytest.approx((5.0 - 4.0) / 4.0)
    # the primary figure for "A beats B": per-seed paired differences with a t-interval over seeds
    between = summary["scales"]["tiny"]["between_arms"]["aux1 - mixture"]
    assert between["per_seed"] == pytest.approx({"1": -0.7, "2": -0.2, "3": -0.2})
    half = 4.303 * statistics.stdev([-0.7, -0.2, -0.2]) / 3 ** 0.5  # t(0.975, 2 df)
    assert between["ci_low"] == pytest.approx(between["mean"] - half, rel=1e-4)
    vs_cache = summary["scales"]["tiny"]["vs_cache"]["aux1"]  # the cache control is 3.9 in every seed
    assert vs_cache["per_seed"] == pytest.approx({"1": -0.4, "2": -0.2, "3": 0.0}, abs=1e-12)


def test_rule_credits_no_arm_that_loses_to_the_cache_control_in_one_seed():
    # aux1 beats the baseline in every seed but not the baseline + cache (3.9) in seed 3 (-0.05 -> 3.95)
    summary = summarize(_study({"aux1": [-0.5, -0.3, -0.05]}))
    decision = summary["decision"]
    assert decision["default"] == "baseline" and decision["credited"] == [] and decision["overrides"] == []
    assert decision["not_credited"]["aux1"] == "not below the baseline + cache in seed 3 at scale tiny (+0.050 nats)"
    assert "the copy head is not credited" in decision["reason"]


def test_rule_keeps_the_simplest_credited_arm_unless_a_complex_one_wins_beyond_the_interval():
    # both credited; sentinel+aux1 is lower on average but its per-seed differences to aux1 (-0.6, +0.1, +0.1)
    # spread too wide: t-interval -0.133 +- 4.303 * 0.404 / sqrt(3) contains 0 -> the simpler aux1 stays
    summary = summarize(_study({"aux1": [-0.3, -0.3, -0.3], "sentinel+aux1": [-0.9, -0.2, -0.2]}))
    decision = summary["decision"]
    assert decision["credited"] == ["aux1", "sentinel+aux1"] and decision["default"] == "aux1"
    assert decision["steps"][0].startswith("sentinel+aux1 - aux1: tiny: -0.133 [") and "kept aux1" in decision["steps"][0]
    assert decision["overrides"] == ["copy_head.lm_loss_weight=1", "copy_head.copy_loss_weight=0",
                                     "copy_head.mixing=gate", "copy_head.decouple_lm=false"]


def test_rule_takes_a_complex_arm_that_wins_at_every_scale():
    summary = summarize(_study({"aux1": [-0.3, -0.31, -0.29], "sentinel+aux1": [-0.5, -0.52, -0.49]}))
    decision = summary["decision"]
    assert decision["default"] == "sentinel+aux1" and "is replaced by sentinel+aux1" in decision["reason"]
    # winning at one scale only is not enough
    runs = _study({"aux1": [-0.3, -0.31, -0.29], "sentinel+aux1": [-0.5, -0.52, -0.49]}, scales=("tiny",))
    runs += _study({"aux1": [-0.3, -0.31, -0.29], "sentinel+aux1": [-0.3, -0.6, -0.2]}, scales=("small",))
    assert summarize(runs)["decision"]["default"] == "aux1"


def test_rule_does_not_default_to_an_arm_missing_at_a_scale_and_marks_partial_grids():
    runs = _study({"mixture": [-0.5, -0.5, -0.5], "aux1": [-0.2, -0.2, -0.2]}, scales=("tiny",))
    runs += _study({"aux1": [-0.2, -0.2, -0.2]}, scales=("small",))
    decision = summarize(runs)["decision"]
    assert "not run at small: it cannot become the default" in decision["not_credited"]["mixture"]
    assert decision["default"] == "aux1" and decision["provisional"]
    assert "tiny-mixture-s4" in decision["missing_runs"] and "small-sentinel+aux1-s1" in decision["missing_runs"]


def test_partial_grid_is_summarized_provisional_with_unpaired_runs_listed():
    runs = [r for r in _study({"aux1": [-0.2, -0.2, -0.2]}, scales=("tiny",)) if r.spec.name != "tiny-baseline-s3"]
    summary = summarize(runs)
    decision = summary["decision"]
    assert summary["scales"]["tiny"]["seeds"] == [1, 2] and decision["unpaired_runs"] == ["tiny-aux1-s3"]
    assert decision["provisional"] and decision["scales_not_started"] == ["small"]
    assert decision["judged_at_scales"] == ["tiny"] and decision["default"] == "aux1"
    single = summarize(_study({"aux1": [-0.2], "sentinel+aux1": [-0.9]}, scales=("tiny",), seeds=(1,)))
    assert single["decision"]["default"] == "aux1"  # one seed: no interval, so the simplest credited arm stays
    assert "no interval" in single["decision"]["steps"][0]
    with pytest.raises(ValueError, match="no scale has a finished baseline"):
        summarize([r for r in runs if r.spec.label["arm"] != "baseline"])


def test_cache_control_flops_efficiency_and_baseline_copy_accuracy():
    summary = summarize(_study({"aux1": [-0.5, -0.3, -0.1]}))
    tiny = summary["scales"]["tiny"]
    cache = tiny["cache_control"]
    assert cache["mean_std"]["val_loss"]["mean"] == pytest.approx(3.9)
    assert cache["paired_vs_baseline"]["val_loss"]["mean"] == pytest.approx(-0.1)
    # aux1 (3.7 mean) vs the cache control (3.9): -0.2 on average
    assert tiny["vs_cache"]["aux1"]["mean"] == pytest.approx(-0.2)
    assert tiny["baseline_copy_accuracy"]["mean"] == 0.0
    fig, base = tiny["arms"]["aux1"]["per_seed"]["1"], tiny["arms"]["baseline"]["per_seed"]["1"]
    # the copy head adds FLOPs: the FLOPs efficiency is the token efficiency times the per-token FLOPs ratio
    assert fig["train_flops_per_token"] > base["train_flops_per_token"] > 0
    ratio = fig["train_flops_per_token"] / base["train_flops_per_token"]
    assert fig["efficiency_flops"] == pytest.approx(fig["efficiency"] * ratio)


def test_headline_table_marks_the_default_and_shows_spreads():
    summary = summarize(_study({"aux1": [-0.5, -0.3, -0.15]}))
    table = headline_table(summary)
    half = 4.303 * statistics.stdev([-0.5, -0.3, -0.15]) / 3 ** 0.5
    mean = (-0.5 - 0.3 - 0.15) / 3
    assert f"| aux1 **(default)** | 3.683 ± 0.176 | {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] (3/3) |" in table
    assert "| baseline+cache (control) | 3.900 ± 0.000 |" in table
    assert table.count("\n") == 1 + 3 * 2  # header, rule, (cache control + 2 arms) x 2 scales
    assert readme_block(summary).splitlines()[1:-1] == table.splitlines()
    assert "nan" not in table


@pytest.mark.parametrize("mixing", ["gate", "sentinel"])
def test_copy_head_params_count_every_mixing_rules_gate_rows(mixing):
    """accounting.copy_head_params = the parameters of the copy head as the (HF) model builds it: sentinel has one
    gate row (d + 1 parameters) per copy head."""
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.sizing.accounting import CopyHeadShape, copy_head_params
    from tests.hf.hf_testing import cplm_config, tiny_cplm

    model = tiny_cplm(cplm_config(copy_mixing=mixing, copy_qk_norm=True))
    built = sum(p.numel() for p in model.copy_head.parameters())
    counted = copy_head_params(ModelConfig(hidden_size=64), CopyHeadShape(3, 16, qk_norm=True, mixing=mixing))
    assert counted == built == 2 * 64 * 3 * 16 + (3 if mixing == "sentinel" else 1) * 65 + 2 * 16
