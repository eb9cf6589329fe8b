"""Experiments: the baseline-vs-CPLM ablation, the recipe study (on CPU or a SLURM cluster), the scaling sweep, the
long-context comparison and their reports.

    from cplm_megatron.experiments.pipeline import run_ablation
    from cplm_megatron.experiments.ablation.plan import AblationSettings
    outcome = run_ablation(Path("runs/ablation"), AblationSettings.quick(), data_dir=Path("data/stdlib"))

One package per experiment, over a shared toolkit (imports run one way: tests/test_layering.py):
  run         a run as data (recipe, typed settings, evaluation, labels)
  records     job.json, timing.json, a finished run's results, the study's summary.json; one reader each
  launch/     one launcher (launcher: `python -m cplm_megatron.pretrain` / `.evaluate` in warm processes, a fresh
              interpreter or torchrun, SLURM); warm holds the forkserver, forkserver_init is what it imports first
  toolkit     matplotlib set up once, tables, cells, grids, bands, save; paired: statistics over seeds
  ablation/   plan (corpus pairs, SpamLang) and report
  study/      plan (arms, scales, grid), cluster (the study on SLURM: submit, collect), summary (aggregation) with
              decision (the rule), report (markdown, plots, README table)
  scaling/    plan (the sweep's grid), sweep (submission, the CLI), report
  long_context/  short-context training vs long-context continuation at 4k-32k: runs, evaluation, report
  pipeline    plan, launch, collect and report an ablation or a study in one call
  cli         tools/ablate.py (also `python -m cplm_megatron.experiments.cli`); demo: tools/demo.py's headline
"""
