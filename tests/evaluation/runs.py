"""Tiny real training runs (baseline and CPLM) and their HF exports, shared by the evaluation tests.

The pair is trained once per test session by the real trainer in its own processes: 2 steps at a tiny
learning rate (so the weights stay next to their initialization, which the init test relies on),
a checkpoint after every step, synthetic copy data, vocabulary 512 (a multiple of Megatron's vocab
padding, so the HF export holds exactly the Megatron output vocabulary).
"""
from __future__ import annotations

from pathlib import Path

from tests import harness

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


def train_pair(root: Path) -> dict[str, Path]:
    """Train the baseline and the CPLM run side by side (warm processes: tests/harness.py); {name: run dir}."""
    runs = {}
    for name, cplm in NAMES.items():
        run_dir = root / name
        runs[name] = (run_dir, harness.start_pretrain(1, [f"run.dir={run_dir}", f"copy_head.enabled={str(cplm).lower()}",
                                                          *TINY], root / f"{name}.log"))
    for name, (_, proc) in runs.items():
        proc.wait(timeout=harness.PROCESS_TIMEOUT_S)
        assert proc.returncode == 0, f"training {name} failed:\n{(root / f'{name}.log').read_text()[-4000:]}"
    return {name: run_dir for name, (run_dir, _) in runs.items()}


def export_hf(run_dirs: dict[str, Path], root: Path, tokenizer: Path) -> dict[str, Path]:
    """tools/convert_to_hf.py on each run's latest checkpoint (subprocesses side by side, as a user runs it)."""
    procs = {name: harness.start_tool("convert_to_hf", "--checkpoint", str(run_dir), "--output", str(root / name),
                                      "--tokenizer", str(tokenizer))
             for name, run_dir in run_dirs.items()}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=harness.PROCESS_TIMEOUT_S)
        assert proc.returncode == 0, f"export of {name} failed:\n{out[-4000:]}"
    return {name: root / name for name in run_dirs}
