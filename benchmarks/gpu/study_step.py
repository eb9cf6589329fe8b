"""The GPU check's `study` step (run_gpu_checks.sh): the GPU study, cplm_megatron.experiments.gpu_study, from the
installed project (`python -m cplm_megatron.experiments gpu_study` is the same study).

    python -m benchmarks.gpu.study_step WORK_DIR [--tiny] [--budget SECONDS]
"""
import sys

from cplm_megatron.experiments.gpu_study.experiment import main

if __name__ == "__main__":
    sys.exit(main())
