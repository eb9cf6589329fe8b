"""Tiny real training runs (baseline and CPLM) and their HF exports, shared by the evaluation tests.

The pair is trained once per test session by the real trainer in subprocesses: 2 steps at a tiny
learning rate (so the weights stay next to their initialization, which the init test relies on),
a checkpoint after every step, synthetic copy data, vocabulary 512 (a multiple of Megatron's vocab
padding, so the HF export holds exactly the Megatron output vocabulary).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VOCAB = 512
SEQ_LEN = 64
LR = 1e-6
TINY = (
    "model.hidden_size=64", "model.num_layers=2", f"model.vocab_size={VOCAB}", "copy_head.heads=2",
    "copy_head.head_dim=16", "data.synthetic=copy", f"train.seq_len={SEQ_LEN}", "train.micro_batch=4",
    "train.global_batch=4", "train.iters=2", f"train.lr={LR}", f"train.min_lr={LR / 10}", "train.log_interval=1",
    "train.eval_interval=0", "checkpoint.interval=1", "checkpoint.keep=10", "logging.wandb=false",
    # the pure mixture objective (not the recipe's + LM CE): an HF export knows only the mixture, so the
    # gradient task's objective and the HF model's loss are the same function only then
    "copy_head.lm_loss_weight=0",
)
NAMES = {"baseline": False, "cplm": True}


def quiet_env() -> dict:
    """Subprocess environment: one thread per process, no warnings spam, offline."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false",
            "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def train_pair(root: Path) -> dict[str, Path]:
    """Train the baseline and the CPLM run side by side; {name: run dir}."""
    procs = {}
    for name, cplm in NAMES.items():
        run_dir = root / name
        cmd = [sys.executable, str(REPO / "pretrain" / "pretrain_cplm.py"), "--config", str(REPO / "configs" / "tiny.yaml"),
               "--set", f"run.dir={run_dir}", f"copy_head.enabled={str(cplm).lower()}", *TINY]
        procs[name] = (run_dir, subprocess.Popen(cmd, cwd=REPO, env=quiet_env(), stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True))
    for name, (_, proc) in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"training {name} failed:\n{out[-4000:]}"
    return {name: run_dir for name, (run_dir, _) in procs.items()}


def export_hf(run_dirs: dict[str, Path], root: Path, tokenizer: Path) -> dict[str, Path]:
    """tools/convert_to_hf.py on each run's latest checkpoint (subprocesses side by side, as a user runs it)."""
    procs = {}
    for name, run_dir in run_dirs.items():
        cmd = [sys.executable, str(REPO / "tools" / "convert_to_hf.py"), "--checkpoint", str(run_dir),
               "--output", str(root / name), "--tokenizer", str(tokenizer)]
        procs[name] = subprocess.Popen(cmd, cwd=REPO, env=quiet_env(), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"export of {name} failed:\n{out[-4000:]}"
    return {name: root / name for name in run_dirs}


def shared_runs(base: Path) -> dict[str, Path]:
    """The session's trained pair under `base` (trained on first use; later callers reuse it)."""
    root = base / "evaluation-runs"
    if not (root / "done").is_file():
        root.mkdir(parents=True, exist_ok=True)
        train_pair(root)
        (root / "done").write_text("ok\n")
    return {name: root / name for name in NAMES}


def shared_exports(base: Path, run_dirs: dict[str, Path], tokenizer: Path) -> dict[str, Path]:
    """The session's HF exports of the trained pair under `base` (exported on first use)."""
    root = base / "evaluation-exports"
    if not (root / "done").is_file():
        root.mkdir(parents=True, exist_ok=True)
        export_hf(run_dirs, root, tokenizer)
        (root / "done").write_text("ok\n")
    return {name: root / name for name in run_dirs}
