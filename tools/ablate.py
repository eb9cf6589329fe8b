#!/usr/bin/env python
"""Baseline vs CPLM ablation at tiny scale, or the multi-seed, two-scale recipe study
(cplm_megatron/experiments/cli.py; `--help` for the whole story).

  .venv/bin/python tools/ablate.py --output runs/ablation --quick          # CI / demo: a few minutes
  .venv/bin/python tools/ablate.py --study --output runs/study             # arms x seeds x scales (hours)
  .venv/bin/python tools/ablate.py --study --summarize-only --output runs/study   # summary of what finished
  .venv/bin/python tools/ablate.py --study-table runs/study/summary.json   # the README's table
"""
import sys

from cplm_megatron.experiments.cli import (  # noqa: F401 - the tool's interface
    main,
    parse_args,
    settings_from_args,
    study_settings_from_args,
)

if __name__ == "__main__":
    sys.exit(main())
