"""Experiments: the baseline-vs-CPLM ablation, the recipe study (on CPU or a SLURM cluster), the scaling sweep and
their reports.

    from cplm_megatron.experiments.plan.run import AblationSettings
    from cplm_megatron.experiments.study import run_ablation
    outcome = run_ablation(Path("runs/ablation"), AblationSettings.quick(), data_dir=Path("data/stdlib"))

Modules: plan (a run as data -- recipe, settings, evaluation, labels -- and the ablation and study plans over it),
launch (one launcher: `python -m cplm_megatron.pretrain` / `.evaluate` in warm processes, a fresh interpreter or
SLURM; warm holds the forkserver), records (job.json, timing.json, a finished run's results; one reader each),
reporting (the report toolkit), multiseed_summary / multiseed_report (the study's aggregation, decision and
report), report (the ablation's markdown + PNG plots), study (either in one call), cluster_study (the study on
SLURM), scaling_sweep / scaling_report (the throughput sweep and its report), cli (tools/ablate.py).
"""
