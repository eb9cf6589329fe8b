"""Suite-wide fixtures: data fixtures (tests/data_fixtures.py) and repo paths."""
import os
import shutil

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # fused copy kernels run in Triton's CPU interpreter

pytest_plugins = ["tests.data_fixtures"]
