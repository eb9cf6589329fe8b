"""Evaluation of Megatron checkpoints and HF exports.

    from cplm_megatron.evaluation.scorers import MegatronScorer, HFScorer, single_process_megatron
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.runner import evaluate, evaluate_checkpoints, format_table

    with single_process_megatron():
        results = evaluate(MegatronScorer.load("runs/tiny"), ["val", "copy", "passkey"], EvalOptions())
    print(format_table(results))

Modules: scorers (one log-prob interface over both backends), metrics, options, cache (the continuous-cache
control), tasks/ (val, copy, passkey, spamlang, gradient, cache, lmeval), runner (tasks -> JSON and a table).
CLI: tools/evaluate.py. The ablation and the recipe study that use it: cplm_megatron/experiments/.
"""
