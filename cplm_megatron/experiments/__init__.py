"""Experiments: the baseline-vs-CPLM ablation, the recipe study (on CPU or a SLURM cluster), the scaling sweep and
their reports.

    from cplm_megatron.experiments.pipeline import run_ablation
    from cplm_megatron.experiments.plan.ablation import AblationSettings
    outcome = run_ablation(Path("runs/ablation"), AblationSettings.quick(), data_dir=Path("data/stdlib"))

One package or module per concern:
  plan/     a run as data (run: recipe, settings, evaluation, labels) and the plans over it: ablation, study (the
            recipe study's arms, scales and grid), cluster (that study on SLURM), scaling (the throughput sweep)
  launch/   one launcher (launcher: `python -m cplm_megatron.pretrain` / `.evaluate` in warm processes, a fresh
            interpreter or torchrun, SLURM); warm holds the forkserver, forkserver_init is what it imports first
  records   job.json, timing.json, a finished run's results, the study's summary.json; one reader each
  report/   toolkit (matplotlib set up once, tables, cells, grids, bands, save) and the reports over it: ablation,
            study_summary (the study's aggregation) with paired (statistics over seeds) and decision (the rule),
            study (its markdown, plots and README table), scaling (the sweep's)
  pipeline  plan, launch, collect and report an ablation or a study in one call
  cli       tools/ablate.py (also `python -m cplm_megatron.experiments.cli`); demo: tools/demo.py's headline
"""
