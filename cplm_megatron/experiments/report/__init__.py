"""Reports: one toolkit (toolkit: matplotlib set up once, tables, number/interval cells, grids, bands, save) and the
reports over it -- the ablation's (ablation), the recipe study's statistics and decision rule (study_summary) and
its report (study), the scaling sweep's (scaling)."""
