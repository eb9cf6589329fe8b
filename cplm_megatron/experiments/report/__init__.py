"""Reports: one toolkit (toolkit: matplotlib set up once, tables, number/interval cells, grids, bands, save) and the
reports over it -- the ablation's (ablation), the recipe study's aggregation (study_summary: per-run figures over
paired.py's statistics and decision.py's rule) and its report (study), the scaling sweep's (scaling)."""
