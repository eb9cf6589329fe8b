"""Suite-wide fixtures: data fixtures (tests/data_fixtures.py) and repo paths; the `mcore` marker."""
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # fused copy kernels run in Triton's CPU interpreter

pytest_plugins = ["tests.data_fixtures"]

# Tests whose outcome depends on megatron-core (model building, parallel state, schedules, optimizer,
# checkpoints, conversion): `make test-mcore-latest` runs them (`-m mcore`) on the newest release too.
# Whole directories, two tools tests, minus the modules there that never reach megatron-core (pure HF
# model code, report writing, path resolution, the copy-head math). Not here: data, kernels, config (no
# megatron-core), slurm (real SLURM), and tools/test_ablate.py + test_demo.py, whose megatron-core use is
# the tiny Trainer runs that tests/training already covers.
MCORE_DIRS = ("model", "parallel", "training", "hf", "evaluation")
MCORE_MODULES = ("tools/test_model_info.py", "tools/test_evaluate.py")
MCORE_FREE = ("model/test_copy_head.py", "hf/test_modeling_cplm.py", "hf/test_cplm_generation.py",
              "hf/test_hf_export.py", "hf/test_lm_eval_export.py", "evaluation/test_report.py")
# Of the slow (multi-process) `mcore` tests, the newest-release leg runs these modules again (marker
# `mcore_latest`): TP/PP/SP/VPP equality and the compat layer's scenarios, where megatron-core's changes
# between releases land; the other slow ones (end-to-end training, conversion, evaluation runs) run on
# the pinned release only, to keep CI within its time budget.
MCORE_LATEST_SLOW = ("parallel/test_layouts.py", "parallel/test_cpu_compat.py")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = item.path.resolve().relative_to(TESTS).as_posix()
        if (rel.split("/")[0] in MCORE_DIRS or rel in MCORE_MODULES) and rel not in MCORE_FREE:
            item.add_marker(pytest.mark.mcore)
            if item.get_closest_marker("slow") is None or rel in MCORE_LATEST_SLOW:
                item.add_marker(pytest.mark.mcore_latest)
