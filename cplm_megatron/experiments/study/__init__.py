"""The recipe study: its arms, scales and grid (plan), the same study on SLURM (cluster: submit, collect), the
aggregation over seeds (summary, with the decision rule in decision) and its report (report: markdown, plots, the
README table)."""
