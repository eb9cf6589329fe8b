"""The report's SpamLang claims from hand-made evaluation curves, and the report/plots it writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.experiments.ablation.report import (
    first_reaching,
    gradient_in_span,
    pair_up,
    spamlang_claims,
    staying_from,
    write_report,
)
from cplm_megatron.experiments.records import RunResults
from cplm_megatron.experiments.run import Evaluation, Run
from cplm_megatron.experiments.toolkit import table

PNG = b"\x89PNG\r\n\x1a\n"


def spamlang_run(cplm: bool, accuracies: dict[int, float], controls: bool = False) -> RunResults:
    labels = (("copy_head", cplm), ("hidden", 64), ("iters", 20), ("tied", False), ("vocab", 8192))
    spec = Run(f"spam-{cplm}", "spam", (("copy_head.enabled", cplm), ("run.seed", 2)), Evaluation(("spamlang",)),
               labels, experiment="spamlang")
    extra = lambda it: {"spamlang_accuracy_previous_token": 1.0, "spamlang_accuracy_cache": 0.99 - it / 1000,  # noqa: E731
                        "spamlang_cache_lambda": 0.9} if controls else {}
    evals = [{"iteration": it, "tasks": {"spamlang": {"metrics": {
        "spamlang_accuracy": acc, "spamlang_loss": 1.0 - acc, "spamlang_target_prob": acc / 2, **extra(it)}},
        "gradient": {"metrics": {"logit_grad_inside_span": 0.1, "copy_grad_share": 0.5 if cplm else 0.0}}}}
        for it, acc in accuracies.items()]
    metrics = [{"iteration": it, "loss": 5.0 - it / 10} for it in range(1, 21)]
    return RunResults(spec, metrics, evals)


def test_first_reaching():
    assert first_reaching([0, 5, 10], [0.2, 0.995, 0.98], 0.99) == 5
    assert first_reaching([0, 5], [0.2, 0.3], 0.99) is None
    assert staying_from([0, 5, 10, 15], [0.995, 0.98, 0.995, 1.0], 0.99) == 10
    assert staying_from([0, 5, 10], [0.995, 1.0, 0.98], 0.99) is None


def test_claims_and_report(tmp_path: Path):
    runs = [spamlang_run(False, {0: 0.0, 5: 0.4, 10: 0.991, 15: 1.0, 20: 1.0}),
            spamlang_run(True, {0: 0.5, 5: 0.992, 10: 0.995, 15: 1.0, 20: 1.0})]
    (claim,) = spamlang_claims(pair_up(runs))
    assert claim["cplm_steps_to_99"] == 5 and claim["baseline_steps_to_99"] == 10
    assert claim["baseline_accuracy_at_cplm_step"] == 0.4
    assert claim["previous_token_accuracy"] is None and claim["baseline_cache_accuracy"] == {}  # not evaluated
    slow = [spamlang_run(False, {0: 0.0, 5: 0.1, 10: 0.2, 15: 0.3, 20: 0.4}, controls=True), runs[1]]
    (claim,) = spamlang_claims(pair_up(slow))
    assert claim["baseline_steps_to_99"] is None and claim["seed"] == 2
    assert claim["previous_token_accuracy"] == 1.0 and claim["baseline_cache_accuracy"][0] == 0.99

    report = write_report(tmp_path, slow, {"command": "tools/ablate.py --quick", "settings": {"hidden_size": 64},
                                           "seconds": 12.0, "runtimes": {"spam-True": (3.0, 4.0)}})
    text = report.read_text()
    # the trivial copiers beside the CPLM, the baseline's loss beside ln V (ln 8192 = 9.011)
    assert ("| 8192 | 128 | 2 | untied | 5 / not within 20 | 1.0000 / 0.4000 | 1.0000 | 0.9900 / 0.9700 | "
            "0.600 / 9.011 | 0.5 / 0.2 |") in text
    assert "| 8192 | 2 | 0.500 / 0.000 / 0.990 | 0.992 / 0.100 / 0.985 |" in text
    assert "the runs' recorded time 7 s" in text  # no timing.json here: the invocation's own figures
    (tmp_path / "runs" / "spam-True").mkdir(parents=True)
    (tmp_path / "runs" / "spam-True" / "timing.json").write_text('{"train_seconds": 130.5, "eval_seconds": 250.0}')
    text = write_report(tmp_path, slow, {"seconds": 0.01, "runtimes": {"spam-True": (0.0, 0.0)}}).read_text()
    assert "the runs' recorded time 380 s" in text and "| spam-True | 130 | 250 |" in text  # a reused run's own time
    assert "![Loss curves](loss_curves.png)" in text and "### Passkey: loss on the key tokens" in text
    assert "(no data for this plot)" in text  # no passkey results in SpamLang runs
    for name in ("loss_curves.png", "copy_accuracy.png", "gradient_retention.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert not (tmp_path / "passkey.png").exists()


def test_the_gradient_plot_draws_the_complement_of_the_tables_outside_share():
    """The table's outside share sits within 1e-3 of 1; the plot draws ||P G|| / ||G|| = sqrt(1 - outside^2) beside its
    chance value (recorded directly, or from the outside share where only that was recorded)."""
    run = spamlang_run(True, {0: 0.5, 5: 0.9})
    run.checkpoints[1]["tasks"]["gradient"]["metrics"] = {"logit_grad_outside_span": 0.998}
    its, inside = gradient_in_span(run)
    assert its == [0, 5] and inside[0] == 0.1 and inside[1] == pytest.approx((1 - 0.998**2) ** 0.5)


def test_the_toolkit_table_aligns_columns_and_refuses_a_wrong_alignment():
    """Every report's markdown table comes from toolkit.table: header, rule ('---:' right-aligns), rows."""
    assert table(["arm", "val"], [["a", "1.0"], ["b", "2.0"]], "lr") == [
        "| arm | val |", "|---|---:|", "| a | 1.0 |", "| b | 2.0 |"]
    assert table(["x", "y"], [])[1] == "|---|---|"
    with pytest.raises(ValueError, match="one 'l' or 'r' per column"):
        table(["x", "y"], [], "r")
