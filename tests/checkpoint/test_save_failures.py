"""A save that hits the process's file-size limit (`ulimit -f`) was a 40-line traceback and exit 1 (torch's zip writer:
`CheckpointException ... unexpected pos`), where a full disk is one line and exit 2. Now a launch whose limit cannot
hold a save's files is refused before anything is written, and a save cut short by the limit is one line naming it,
exit 2, the previous checkpoint intact (SIGXFSZ does not kill the trainer: Python ignores it)."""
from __future__ import annotations

import contextlib
import resource
import shlex
import subprocess
from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import read_latest, verify_checkpoint, verify_contents
from cplm_megatron.checkpoint.storage import format_bytes
from cplm_megatron.errors import CheckpointError
from tests import harness
from tests.checkpoint.checkpoint_files import shards, tiny_config, write_checkpoints
from tests.trained_runs import REFERENCE_ITERS, copy_run
from tests.training import pretrain_utils as pu

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


@contextlib.contextmanager
def file_size_limit(limit: int):
    """This process's soft RLIMIT_FSIZE at `limit` bytes while the block runs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_save_cut_short_by_the_file_size_limit_is_named(tmp_path: Path) -> None:
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.model.builder import build_run, model_run
    from cplm_megatron.model.layout import single_process_megatron
    from cplm_megatron.training.preflight import checkpoint_size

    cfg = tiny_config(tmp_path / "run")
    root = write_checkpoints(cfg, [1])
    largest = max(p.stat().st_size for p in shards(root / "iter_0000001"))
    with single_process_megatron(cfg.model, cfg.run.seed):
        chunk = build_run(model_run(cfg.model, cfg.copy_head)).model
        saver = Checkpointer(root, keep=5, log=lambda m: None, resumed_from=1, checkpoint_size=checkpoint_size(cfg))
        with file_size_limit(largest - 4096), pytest.raises(CheckpointError) as refused:
            saver.save([chunk], None, None, TrainState(iteration=2), None, cfg.to_dict())
    assert str(refused.value).startswith(
        f"saving a checkpoint in {root} failed: {root}/iter_0000002/__0_")
    assert (f"reached this process's file-size limit ({format_bytes(largest - 4096)}, ulimit -f); the previous checkpoint is "
            f"intact: raise the limit (ulimit -f unlimited) and relaunch to resume from it") in str(refused.value)
    assert verify_checkpoint(read_latest(root)).iteration == 1
    verify_contents(read_latest(root))


def _relaunch_under_limit(stdlib_corpus, run_dir: Path, blocks: int) -> subprocess.CompletedProcess:
    """The stopped run's command relaunched from a shell whose `ulimit -f` is `blocks` (1 KiB each)."""
    command = harness.pretrain_command(1, pu.tiny_overrides(stdlib_corpus, run_dir, REFERENCE_ITERS))
    return subprocess.run(["bash", "-c", f"ulimit -f {blocks} && exec {shlex.join(command)}"], cwd=harness.REPO,
                          env=harness.process_env(), capture_output=True, text=True, timeout=harness.PROCESS_TIMEOUT_S)


@pytest.mark.usefixtures("isolated_streaming")
def test_a_relaunch_under_ulimit_f_is_one_line_exit_2_and_keeps_the_checkpoints(stdlib_corpus, stopped_run,
                                                                                 tmp_path: Path) -> None:
    """Below the planner's size of a save's files the launch is refused before anything is written; between that and
    the real size, the save is cut short: one line, exit 2, `latest` and every checkpoint as they were."""
    from cplm_megatron.run_config import load_run_config
    from cplm_megatron.training.preflight import checkpoint_size

    run_dir = copy_run(stopped_run, tmp_path)
    before = pu.files_of(run_dir)
    refused = _relaunch_under_limit(stdlib_corpus, run_dir, 4000)
    pu.assert_bad_input(refused, "file-size limit (3.91 MiB, ulimit -f)", "raise the limit (ulimit -f unlimited)")
    assert pu.files_of(run_dir) == before

    checkpoints = pu.files_of(run_dir / "checkpoints")
    largest = max(p.stat().st_size for p in shards(run_dir / "checkpoints" / "iter_0000004"))
    planned = checkpoint_size(load_run_config(str(harness.TINY_RECIPE),
                                              pu.tiny_overrides(stdlib_corpus, run_dir, REFERENCE_ITERS)))
    blocks = (largest >> 10) - 8  # passes the launch's check (the planner's size), cut short by the real one
    assert blocks << 10 > 0.9 * planned / 2, (largest, planned)
    cut = _relaunch_under_limit(stdlib_corpus, run_dir, blocks)
    line = pu.assert_bad_input(cut, "saving a checkpoint in", f"reached this process's file-size limit "
                                    f"({format_bytes(blocks << 10)}, ulimit -f)")
    assert "Traceback" not in cut.stdout + cut.stderr, cut.stderr[-3000:]
    assert "iter_0000006" in line, line
    assert read_latest(run_dir / "checkpoints").name == "iter_0000004"
    after = pu.files_of(run_dir / "checkpoints")
    assert {name: data for name, data in after.items() if not name.startswith("iter_0000006")} == checkpoints
