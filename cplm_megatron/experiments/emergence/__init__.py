"""The emergence study: does the copy head still help once the baseline has learned to copy in context?

plan     the corpora (code, prose), the pilot's variants and the study's grid (domains x arms x seeds) as runs
summary  per run the probe curves (copy accuracy, in-context score) and the step where copying emerges; per domain
         the recipe study's aggregation with its decision rule, credited only where the baseline copies
report   report.md and one figure
cli      tools/emergence.py (also `python -m cplm_megatron.experiments.emergence.cli`)
"""
