"""Checkpointer pruning: keep the newest `keep` of the run's own history, never a checkpoint it did not write."""
from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import list_checkpoints, read_latest, verify_checkpoint
from cplm_megatron.errors import CheckpointError
from tests.checkpoint.checkpoint_files import tiny_config, write_checkpoints

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def _save(cfg, root: Path, iterations, keep: int, resumed_from=None) -> None:
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import single_process_megatron
    from cplm_megatron.training.preflight import checkpoint_size

    with single_process_megatron(cfg.model, cfg.run.seed):
        chunk = build_run(model_run(cfg.model, cfg.copy_head)).model
        saver = Checkpointer(root, keep=keep, log=lambda message: None, resumed_from=resumed_from,
                             checkpoint_size=checkpoint_size(cfg))
        for iteration in iterations:
            saver.save([chunk], None, None, TrainState(iteration=iteration), None, cfg.to_dict())


def names(root: Path) -> list[str]:
    return [p.name for p in list_checkpoints(root)]


def test_pruning_keeps_what_this_run_did_not_write(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run")
    root = write_checkpoints(cfg, [5, 6])  # e.g. a later history `latest` was moved back from
    _save(cfg, root, [1, 2, 3], keep=1)  # a launch that did not resume: 5 and 6 are not its own
    assert names(root) == ["iter_0000003", "iter_0000005", "iter_0000006"]
    assert read_latest(root).name == "iter_0000003"


def test_pruning_counts_the_history_resumed_through(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run")
    root = write_checkpoints(cfg, [2, 4])
    _save(cfg, root, [6, 8], keep=2, resumed_from=4)  # 2 and 4 are the run's history: pruned like its own saves
    assert names(root) == ["iter_0000006", "iter_0000008"]


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str = "512k"):
    """A tmpfs of `size` mounted at `directory` (needs mount rights: root in a privileged container)."""
    directory.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root in a privileged container)")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=False)


# the tiny model at its smallest: ~340 KiB per checkpoint with its optimizer (planner), ~100 KiB of weights saved
SMALLEST = ["model.vocab_size=64", "model.hidden_size=32", "model.ffn_hidden_size=64"]


def test_a_full_disk_during_a_save_says_disk_and_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """512 KiB fit a few checkpoints of the smallest model, not six: a save fails inside torch (ENOSPC, wrapped in
    torch's CheckpointException, or the zip writer's "unexpected pos"), reported as a full disk."""
    with small_filesystem(tmp_path / "small") as small:
        root = small / "checkpoints"
        with pytest.raises(CheckpointError, match=r"saving a checkpoint in \S+ failed: the disk is full \(\d.* free "
                                                  r"on .* a checkpoint needs ~.*\); the previous checkpoint "
                                                  r"is intact"):
            _save(tiny_config(tmp_path / "run", *SMALLEST), root, [1, 2, 3, 4, 5, 6], keep=10)
        assert verify_checkpoint(read_latest(root)).iteration >= 1


def test_a_checkpoint_dir_that_turned_read_only_is_named(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "run", *SMALLEST)
    with small_filesystem(tmp_path / "small", "4m") as small:
        root = small / "checkpoints"
        _save(cfg, root, [1], keep=10)
        subprocess.run(["mount", "-o", "remount,ro", str(small)], check=True)
        with pytest.raises(CheckpointError, match=rf"saving a checkpoint in {root} failed: it is no longer writable "
                                                  r"\(.*Read-only file system.*\); the previous checkpoint is intact"):
            _save(cfg, root, [2], keep=10)
        assert verify_checkpoint(read_latest(root)).iteration == 1
