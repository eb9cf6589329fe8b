"""Plans: a run as data (run: recipe, settings, evaluation, labels) and the experiments declared over it -- the
ablation, the recipe study, the recipe study on SLURM (cluster) and the throughput sweep (scaling)."""
