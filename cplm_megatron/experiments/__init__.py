"""Experiments: the baseline-vs-CPLM ablation, the recipe study (on CPU or a SLURM cluster), the emergence study,
the scaling sweep, the long-context comparison, the GPU check's study and their reports.

    .venv/bin/python -m cplm_megatron.experiments --list
    from cplm_megatron.experiments.pipeline import run_experiment
    from cplm_megatron.experiments.registry import Context
    outcome = run_experiment("ablation", AblationSettings.quick(), Context(Path("runs/ablation"), Path("data/stdlib")))

One package per experiment, each declaring its `Experiment` in experiment.py (settings, plan, run, report, its
command line), found by scanning (registry); over a shared toolkit (imports run one way: tests/test_layering.py):
  run         a run as data (recipe, typed settings, evaluation, labels)
  records     job.json, timing.json, a finished run's results, the study's summary.json; one reader each
  launch/     one launcher (launcher: `python -m cplm_megatron.pretrain` / `.evaluate` in warm processes, a fresh
              interpreter or torchrun, SLURM); warm holds the forkserver, forkserver_init is what it imports first
  toolkit     matplotlib set up once, tables, cells, grids, bands, save; paired: statistics over seeds
  progress    while jobs run: run k of N, the overall ETA, each job's latest progress line
  registry    the `Experiment` spec, the scan, `register_experiment`, lookup by name
  ablation/   plan (corpus pairs, SpamLang), pipeline, report
  study/      plan (arms, scales, grid), pipeline (with SpamLang, run as the ablation by name), cluster (the study
              on SLURM: submit, collect), summary (aggregation) with decision (the rule), report
  scaling/    plan (the sweep's grid), sweep (submission, the CLI), report
  long_context/  short-context training vs long-context continuation at 4k-32k: runs, evaluation by length, report
  gpu_study/  the GPU check's study (benchmarks/gpu/study_step.py): sizes and throughput estimate, the arms trained
              within a time budget, scoring with controls and paired comparisons, study.json
  emergence/  plan, study, summary, report, cli (tools/emergence.py)
  pipeline    any experiment by name: plan, run, report
  __main__    `python -m cplm_megatron.experiments NAME ...`: every experiment's command line
  cli         tools/ablate.py (the ablation and, with --study, the recipe study); demo: tools/demo.py's headline
"""
