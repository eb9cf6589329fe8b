#!/usr/bin/env python
"""Evaluate a Megatron checkpoint or an HF export on the CPLM evaluation tasks: `cplm_megatron/evaluate.py`
(also `python -m cplm_megatron.evaluate`) as a script of the checkout; `--help` lists the tasks.

  .venv/bin/python tools/evaluate.py --checkpoint runs/tiny --tasks val,copy,passkey,spamlang,gradient \\
      --output runs/tiny/eval.json
"""
import sys

from cplm_megatron.evaluate import main, options_from_args, parse_args, run  # noqa: F401 - the script's interface

if __name__ == "__main__":
    sys.exit(main())
