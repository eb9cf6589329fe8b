"""No orphans (issue 30 item 5): a trainer killed with -9 mid-run leaves none of its helper processes alive
(megatron's spawned async-writer Manager used to live on, parent 1, for minutes)."""
import os
import signal
import time

import psutil
import pytest

from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


def test_kill_9_of_an_async_saving_trainer_leaves_no_process_behind(stdlib_corpus, tmp_path):
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{
        "checkpoint.async_save": "true", "checkpoint.interval": 2}), log)
    try:
        pu.wait_for(lambda: log.exists() and "saved" in log.read_text(), timeout=300)
        trainer = psutil.Process(pu.worker_pids(proc)[0])
        helpers = trainer.children(recursive=True)
        assert any("multiprocessing" in " ".join(h.cmdline()) for h in helpers), [h.cmdline() for h in helpers]
        os.kill(trainer.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE
                                                  for h in helpers):
            time.sleep(0.2)
        alive = [h for h in helpers if h.is_running() and h.status() != psutil.STATUS_ZOMBIE]
        assert not alive, [(h.pid, h.cmdline()) for h in alive]
    finally:
        pu.kill_group(proc)
