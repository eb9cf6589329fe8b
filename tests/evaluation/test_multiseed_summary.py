"""The recipe study's aggregation: efficiency, mean/std, paired differences, the decision rule, the tables."""
import pytest

from cplm_megatron.evaluation.ablation import RunResults, RunSpec
from cplm_megatron.evaluation.multiseed import GLOBAL_BATCH, SEQ_LEN
from cplm_megatron.evaluation.multiseed_report import headline_table, readme_block
from cplm_megatron.evaluation.multiseed_summary import decide, summarize, tokens_to_reach

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

TOKENS_PER_STEP = GLOBAL_BATCH * SEQ_LEN


def _run(scale: str, arm: str, seed: int, losses: list[float], lm_losses: list[float] | None = None,
         copy: float = 0.0, layers: int = 4, interval: int = 100) -> RunResults:
    iters = interval * len(losses)
    labels = {"arm": arm, "scale": scale, "seed": seed, "hidden": 64 * layers // 4, "layers": layers, "vocab": 4096,
              "iters": iters, "copy_head": arm != "baseline"}
    spec = RunSpec(f"{scale}-{arm}-s{seed}", f"{scale}-s{seed}", "study", arm != "baseline", (), (),
                   tuple(sorted(labels.items())), every_checkpoint=False)
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
    return RunResults(spec, metrics, [final])


def test_tokens_to_reach_interpolates_between_evaluations():
    curve = [(100, 6.0), (200, 5.0), (300, 4.0)]
    # fp64 arithmetic of a few operations: pytest.approx's default rel 1e-6 is far above its rounding (~1e-16)
    assert tokens_to_reach(curve, 4.5) == pytest.approx(250 * TOKENS_PER_STEP)
    assert tokens_to_reach(curve, 6.5) == 100 * TOKENS_PER_STEP  # already reached at the first evaluation
    assert tokens_to_reach(curve, 3.9) is None


def _study(arm_offsets: dict[str, list[float]], scales=("tiny", "4x")) -> list[RunResults]:
    """Baselines 6 -> 5 -> 4 (last: 4.0); arm curves shifted per seed by the given offsets."""
    runs = []
    for scale in scales:
        layers = 4 if scale == "tiny" else 8
        for seed_index, seed in enumerate((1, 2, 3)):
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


def test_decision_prefers_arms_better_everywhere_then_lowest_mean_at_the_largest_scale():
    # "decoupled" has the lowest mean but loses one seed; "aux1" wins every seed
    summary = summarize(_study({"aux1": [-0.2, -0.2, -0.2], "decoupled": [-0.9, -0.9, 0.05]}))
    assert summary["largest_scale"] == "4x"
    assert summary["decision"]["default"] == "aux1"
    assert summary["decision"]["qualified"] == ["aux1"]
    assert summary["decision"]["overrides"] == ["copy_head.lm_loss_weight=1", "copy_head.decouple_lm=false"]


def test_decision_without_a_qualified_arm_says_so():
    summary = summarize(_study({"mixture": [0.2, -0.1, 0.1], "aux1": [0.1, 0.1, -0.3]}))
    decision = decide(summary["scales"], "4x")
    assert decision.qualified == [] and decision.default == "aux1"  # lowest mean among all CPLM arms
    assert decision.reason.startswith("no CPLM arm beat the baseline")


def test_incomplete_study_is_an_error_naming_the_missing_runs():
    runs = [r for r in _study({"aux1": [-0.1, -0.1, -0.1]}, scales=("tiny",)) if r.spec.name != "tiny-aux1-s2"]
    with pytest.raises(ValueError, match="tiny-aux1-s2"):
        summarize(runs)


def test_headline_table_marks_the_default_and_shows_spreads():
    summary = summarize(_study({"aux1": [-0.5, -0.3, -0.1]}))
    table = headline_table(summary)
    assert "| aux1 **(default)** | 3.700 ± 0.200 | -0.300 ± 0.200 (3/3) |" in table
    assert table.count("\n") == 1 + 2 * 2  # header, rule, 2 arms x 2 scales
    assert readme_block(summary).splitlines()[1:-1] == table.splitlines()
    assert "nan" not in table
