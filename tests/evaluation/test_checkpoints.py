"""Locating checkpoints: run dir, checkpoints root, iter dir; clear errors otherwise."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.evaluation.checkpoints import all_checkpoints, resolve_checkpoint


def test_resolve_run_dir_root_and_iter_dir(runs: dict[str, Path]):
    run = runs["cplm"]
    latest = run / "checkpoints" / "iter_0000002"
    assert resolve_checkpoint(run).path == latest and resolve_checkpoint(run).iteration == 2
    assert resolve_checkpoint(run / "checkpoints").path == latest
    first = resolve_checkpoint(run / "checkpoints" / "iter_0000001")
    assert first.iteration == 1
    assert [r.iteration for r in all_checkpoints(run)] == [1, 2]


def test_missing_checkpoints_name_the_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        all_checkpoints(tmp_path)
