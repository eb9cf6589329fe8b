#!/usr/bin/env python
"""Does the copy head still help once the baseline copies? The pilot and the grid on code and prose
(cplm_megatron/experiments/emergence/cli.py; `--help` for the whole story).

  .venv/bin/python tools/emergence.py --pilot --output results/emergence_cpu
  taskset -c 1 .venv/bin/python tools/emergence.py --output results/emergence_cpu     # the grid (hours; resumable)
  .venv/bin/python tools/emergence.py --summarize-only --output results/emergence_cpu
"""
import sys

from cplm_megatron.experiments.emergence.cli import main

if __name__ == "__main__":
    sys.exit(main())
