"""Evaluation of Megatron checkpoints and HF exports, and the baseline-vs-CPLM ablation.

    from cplm_megatron.evaluation.scorers import MegatronScorer, HFScorer, single_process_megatron
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.runner import evaluate, evaluate_checkpoints, format_table

    with single_process_megatron():
        results = evaluate(MegatronScorer.load("runs/tiny"), ["val", "copy", "passkey"], EvalOptions())
    print(format_table(results))

    from cplm_megatron.evaluation.ablation import Settings
    from cplm_megatron.evaluation.study import run_ablation
    outcome = run_ablation(Path("runs/ablation"), Settings.quick(), data_dir=Path("data/stdlib"))

Modules: scorers (one log-prob interface over both backends), checkpoints (locating them),
metrics, options, tasks/ (val, copy, passkey, spamlang, gradient, lmeval), runner (tasks -> JSON
and a table), ablation (plan/launch/read the paired runs), report (markdown + PNG plots), study
(the ablation in one call). CLIs: tools/evaluate.py, tools/ablate.py.
"""
