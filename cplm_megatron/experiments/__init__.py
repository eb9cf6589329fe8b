"""Experiments: how studies and ablations run their jobs (warm processes: warm.py)."""
