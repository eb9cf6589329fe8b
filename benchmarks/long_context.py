"""Long-context evaluation: passkey retrieval and copy accuracy by context length for a tiny baseline and a tiny
CPLM trained with context parallelism at one length, scored at that length and beyond (the long_context
experiment: cplm_megatron/experiments/long_context/; `--help` for the whole story).

  taskset -c 0 .venv/bin/python -m benchmarks.long_context            # CP=2 at 8k, scored at 4k/8k/16k/32k
"""
import sys

from cplm_megatron.experiments.long_context.comparison import main

if __name__ == "__main__":
    sys.exit(main())
