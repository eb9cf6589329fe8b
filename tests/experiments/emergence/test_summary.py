"""The emergence study's aggregation (experiments/emergence/summary.py): probe curves, where copying emerges, and
the per-domain verdict gated by the baseline's copy accuracy."""
from __future__ import annotations

from types import SimpleNamespace

from cplm_megatron.experiments.emergence.summary import domain_verdict, emergence_point, probe_curve


def run_with(probes: list[tuple[int, float, float]], per_step: int = 1024):
    metrics = [{"iteration": it, "loss": 5.0} for it, _, _ in probes]
    metrics += [{"iteration": it, "probe_copy_accuracy": acc, "probe_in_context_score": icl} for it, acc, icl in probes]
    metrics.append({"iteration": probes[-1][0], "probe_copy_accuracy": 0.9, "probe_in_context_score": -1.0})  # rerun
    return SimpleNamespace(metrics=metrics, spec=SimpleNamespace(label={"tokens_per_step": per_step}))


def test_the_probe_curve_keeps_the_last_record_per_iteration_in_order():
    curve = probe_curve(run_with([(1000, 0.2, -0.1), (0, 0.0, 0.0), (2000, 0.6, -0.3)]))
    assert [(p["iteration"], p["tokens"], p["copy_accuracy"]) for p in curve] == [
        (0, 0, 0.0), (1000, 1024_000, 0.2), (2000, 2048_000, 0.9)]


def test_emergence_is_the_first_probe_at_the_level():
    curve = probe_curve(run_with([(0, 0.0, 0.0), (1000, 0.05, 0.0), (2000, 0.12, 0.0), (3000, 0.55, 0.0),
                                  (4000, 0.4, 0.0)]))
    assert emergence_point(curve, "copy_accuracy", 0.1) == {"iteration": 2000, "tokens": 2048_000,
                                                            "first_measured": False}
    assert emergence_point(curve, "copy_accuracy", 0.5) == {"iteration": 3000, "tokens": 3072_000,
                                                            "first_measured": False}
    assert emergence_point(curve, "copy_accuracy", 0.95) is None
    assert emergence_point(curve, "text_copy_gain", 0.0) is None  # not probed: never


def test_a_level_met_at_the_first_probe_measuring_it_is_marked_reached_by_then():
    """The pilot's probes gained the text copy figures at step 23,000: its gain was reached by then, not there."""
    curve = [{"iteration": it, "tokens": it, "text_copy_gain": gain} for it, gain in ((0, None), (1000, 0.3), (2000, 0.4))]
    assert emergence_point(curve, "text_copy_gain", 0.1)["first_measured"] is True
    assert emergence_point(curve[1:], "text_copy_gain", 0.1)["first_measured"] is False  # probed from the start


def _scale(arm_loss: list[float], cache_loss: list[float]) -> dict:
    base = {str(s): {"val_loss": 3.0, "copy_accuracy": 0.01, "cache_val_loss": cl, "val_documents": None,
                     "cache_documents": None} for s, cl in zip((1, 2, 3), cache_loss)}
    arm = {str(s): {"val_loss": v, "copy_accuracy": 0.9, "val_documents": None} for s, v in zip((1, 2, 3), arm_loss)}
    return {"arms": {"baseline": {"per_seed": base}, "aux1": {"per_seed": arm}}, "seeds": [1, 2, 3]}


def _gains(domain: str, gains: list[float | None]) -> dict:
    return {f"{domain}-baseline-s{s}": {"final_text_copy_gain": g} for s, g in zip((1, 2, 3), gains)}


def test_a_domain_whose_baseline_copies_is_judged_by_the_rule():
    copies = _gains("code", [0.15, 0.2, 0.12])
    verdict = domain_verdict(_scale([2.8, 2.7, 2.9], [2.95, 2.9, 2.95]), "code", 0.1, copies)
    assert verdict["baseline_copies"] and verdict["credited"] == ["aux1"]
    verdict = domain_verdict(_scale([2.8, 2.95, 2.9], [2.95, 2.9, 2.95]), "code", 0.1, copies)
    assert verdict["credited"] == [] and "not below the baseline + cache in seed 2" in verdict["verdict"]


def test_a_domain_whose_baseline_does_not_copy_is_reported_not_judged():
    for gains in ([0.15, 0.05, 0.12], [0.15, None, 0.12]):
        verdict = domain_verdict(_scale([2.8, 2.7, 2.9], [2.95, 2.9, 2.95]), "prose", 0.1, _gains("prose", gains))
        assert not verdict["baseline_copies"] and verdict["credited"] == []
        assert verdict["verdict"].startswith("not judged: the baseline's text copy gain is below 0.1 in some seed")
        assert verdict["rule_outcome"]["credited"] == ["aux1"]  # what the rule alone would say stays on record


def test_throughput_is_the_median_of_the_logged_intervals():
    from cplm_megatron.experiments.emergence.summary import median_tokens_per_sec

    logged = [{"iteration": i, "tokens_per_sec": t} for i, t in enumerate([7500, 7400, 3100, 7600, 7450])]
    assert median_tokens_per_sec(SimpleNamespace(metrics=logged + [{"iteration": 5, "val_loss": 3.0}])) == 7450
    assert median_tokens_per_sec(SimpleNamespace(metrics=[])) is None


def test_a_run_of_one_domain_summarizes_every_built_domain(tmp_path):
    """`--domains code` trains code only; its summary keeps prose's finished runs when the prose corpus is built (it
    wrote a code-only summary.json over the two-domain one), and names no domain whose corpus was never built."""
    from cplm_megatron.experiments.emergence.plan import EmergenceSettings, corpus_dirs
    from cplm_megatron.experiments.emergence.study import summarized

    prose = corpus_dirs(("prose",), tmp_path)["prose"]
    for split in ("train", "dev", "val"):
        (prose / split).mkdir(parents=True)
        (prose / split / "manifest.json").write_text("{}")
    assert summarized(EmergenceSettings(domains=("code",)), tmp_path).domains == ("code", "prose")
    assert summarized(EmergenceSettings(domains=("prose",)), tmp_path).domains == ("prose",)  # code not built
    (prose / "val" / "manifest.json").unlink()  # a corpus missing a split is not built
    assert summarized(EmergenceSettings(domains=("code",)), tmp_path).domains == ("code",)
