"""Sizing from the config alone: parameter counts, FLOPs and memory (accounting), the time of a step (step_time), the
layouts that fit a node (planner), and what tools/model_info.py reports (info)."""
