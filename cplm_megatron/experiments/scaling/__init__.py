"""The throughput sweep over model sizes and node counts on SLURM: its grid and submission (plan) and its report
(report: tables and plots from the runs' records)."""
