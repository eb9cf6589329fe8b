"""The report's SpamLang claims from hand-made evaluation curves, and the report/plots it writes."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.experiments.plan.run import Evaluation, Run
from cplm_megatron.experiments.records import RunResults
from cplm_megatron.experiments.report.ablation import first_reaching, pair_up, spamlang_claims, staying_from, write_report
from cplm_megatron.experiments.report.toolkit import table

PNG = b"\x89PNG\r\n\x1a\n"


def spamlang_run(cplm: bool, accuracies: dict[int, float]) -> RunResults:
    labels = (("copy_head", cplm), ("hidden", 64), ("iters", 20), ("tied", False), ("vocab", 8192))
    spec = Run(f"spam-{cplm}", "spam", (("copy_head.enabled", cplm),), Evaluation(("spamlang",)), labels,
               experiment="spamlang")
    evals = [{"iteration": it, "tasks": {"spamlang": {"metrics": {
        "spamlang_accuracy": acc, "spamlang_loss": 1.0 - acc, "spamlang_target_prob": acc / 2}},
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
    slow = [spamlang_run(False, {0: 0.0, 5: 0.1, 10: 0.2, 15: 0.3, 20: 0.4}), runs[1]]
    (claim,) = spamlang_claims(pair_up(slow))
    assert claim["baseline_steps_to_99"] is None

    report = write_report(tmp_path, slow, {"command": "tools/ablate.py --quick", "settings": {"hidden_size": 64},
                                           "seconds": 12.0, "runtimes": {"spam-True": (3.0, 4.0)}})
    text = report.read_text()
    assert "| 8192 | 128 | untied | 5 / not within 20 | 5 / below at step 20 | 0.1000 |" in text
    assert "![Loss curves](loss_curves.png)" in text and "Passkey operating points" in text
    assert "(no data for this plot)" in text  # no passkey results in SpamLang runs
    for name in ("loss_curves.png", "copy_accuracy.png", "gradient_retention.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG
    assert not (tmp_path / "passkey.png").exists()


def test_the_toolkit_table_aligns_columns_and_refuses_a_wrong_alignment():
    """Every report's markdown table comes from toolkit.table: header, rule ('---:' right-aligns), rows."""
    assert table(["arm", "val"], [["a", "1.0"], ["b", "2.0"]], "lr") == [
        "| arm | val |", "|---|---:|", "| a | 1.0 |", "| b | 2.0 |"]
    assert table(["x", "y"], [])[1] == "|---|---|"
    with pytest.raises(ValueError, match="one 'l' or 'r' per column"):
        table(["x", "y"], [], "r")
