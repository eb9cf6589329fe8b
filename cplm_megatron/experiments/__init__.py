"""Experiments: the baseline-vs-CPLM ablation and the recipe study.

    from cplm_megatron.experiments.ablation import Settings
    from cplm_megatron.experiments.study import run_ablation
    outcome = run_ablation(Path("runs/ablation"), Settings.quick(), data_dir=Path("data/stdlib"))

Modules: ablation (plan/launch/read the paired runs), multiseed (the recipe study's plan: arms x seeds x
scales) and multiseed_summary / multiseed_report (its aggregation, decision and report), report (the
ablation's markdown + PNG plots), study (either in one call), warm (jobs in processes forked from a
preloaded forkserver). CLI: tools/ablate.py.
"""
