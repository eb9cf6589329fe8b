"""Real torch_dist checkpoints of a tiny model, written in this process, for the lookup/resume tests."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable, List

from cplm_megatron.run_config import RunConfig, load_run_config

REPO = Path(__file__).resolve().parents[2]
# A tiny model: small enough to save three checkpoints in a few seconds.
TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_attention_heads=2", "model.ffn_hidden_size=128",
        "model.vocab_size=256", "copy_head.head_dim=16", "train.seq_len=32", "train.micro_batch=2",
        "train.global_batch=4", "data.synthetic=copy", "logging.wandb=false"]


def tiny_config(run_dir: Path, *overrides: str) -> RunConfig:
    """configs/tiny.yaml shrunk to TINY, in `run_dir`, plus `overrides`."""
    return load_run_config(str(REPO / "configs" / "tiny.yaml"), [*TINY, f"run.dir={run_dir}", *overrides])


def write_checkpoints(cfg: RunConfig, iterations: Iterable[int]) -> Path:
    """Checkpoints (weights, RNG, config; no optimizer) at `iterations` under run.dir/checkpoints, via the
    trainer's Checkpointer in a one-process group; returns the checkpoint root. Applies the megatron-core patch layer (the
    entry point's job: module fixtures calling this run before the suite's per-test one in tests/conftest.py)."""
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import single_process_megatron
    from cplm_megatron.parallel.megatron_patches import apply_compat

    apply_compat()
    iterations = list(iterations)
    root = Path(cfg.run.dir) / "checkpoints"
    with single_process_megatron(cfg.model, cfg.run.seed):
        chunk = build_run(model_run(cfg.model, cfg.copy_head)).model
        saver = Checkpointer(root, keep=len(iterations), log=lambda message: None)
        for iteration in iterations:
            saver.save([chunk], None, None, TrainState(iteration=iteration), None, cfg.to_dict())
    return root


def copy_run(source: Path, target: Path) -> Path:
    """A private copy of a run directory (tests damage their copy)."""
    return Path(shutil.copytree(source, target, symlinks=True))


def shards(iter_dir: Path) -> List[Path]:
    """The *.distcp files of a checkpoint."""
    return sorted(iter_dir.glob("*.distcp"))


# What the damage check reports when the common state is gone: common.pt (megatron-core 0.16) or, where the
# torch_dist shard holds it as the `common_state` object (0.19), that shard.
COMMON_STATE_GONE = (r"(common\.pt \(iteration, scheduler, data position, config\) is missing"
                     r"|shard file __0_0\.distcp is missing)")


def remove_common_state(iter_dir: Path) -> None:
    """Delete a checkpoint's common state (iteration, scheduler, data position, config) in either format."""
    common = iter_dir / "common.pt"
    if common.is_file():
        common.unlink()
    else:
        for shard in shards(iter_dir):
            shard.unlink()


def damage_common_state(iter_dir: Path) -> Path:
    """Invert the first 64 bytes of a checkpoint's common state (common.pt, or the `common_state` object's bytes in
    its torch_dist shard): unpicklable. Returns the file damaged."""
    common = iter_dir / "common.pt"
    if common.is_file():
        file, offset = common, 0
    else:
        from torch.distributed.checkpoint import FileSystemReader

        storage = FileSystemReader(str(iter_dir)).read_metadata().storage_data
        [info] = [info for index, info in storage.items() if index.fqn.startswith("common_state")]
        file, offset = iter_dir / info.relative_path, info.offset
    data = bytearray(file.read_bytes())
    data[offset:offset + 64] = bytes(b ^ 0xFF for b in data[offset:offset + 64])
    file.write_bytes(bytes(data))
    return file
