"""The long-context comparison: a tiny baseline and a tiny CPLM trained short, continued at a long length with
context parallelism, scored by length (passkey, copy) at that length and beyond.

comparison  the phases, their training under torchrun (settings and time recorded per run dir), the scoring by length,
            the JSON and the plot; the command line of benchmarks/long_context.py
experiment  its registration (registry.py)
"""
