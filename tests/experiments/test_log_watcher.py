"""The ablation's progress while its jobs run: each run's latest step, loss and ETA with the log it comes from,
printed once per change; reused runs' old logs stay quiet."""
from __future__ import annotations

import os
import time
from pathlib import Path

from cplm_megatron.experiments.pipeline import LogWatcher

LINE = ("iter {it}/200 | loss {loss} | lm-head 6.3609 | objective 12.5712 (loss + 1×lm-head) | gate 0.123 | "
        "lr 3.00e-04 | gnorm 1.500 | host mem 1.00/1.50 GiB | tok/s 9,000 | TFLOP/s/dev 0.100 | MFU 1.00% | ETA 0:01:{s}")


def test_progress_lines_name_the_log_once_and_follow_each_run(tmp_path: Path):
    old = tmp_path / "reused-cplm" / "train.log"
    old.parent.mkdir()
    old.write_text(LINE.format(it=200, loss=3.1, s=00) + "\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    watcher = LogWatcher(tmp_path, every=0)
    log = tmp_path / "corpus-cplm" / "train.log"
    log.parent.mkdir()
    log.write_text("$ python -m cplm_megatron.pretrain ...\n")
    assert watcher.poll() == [f"[ablate] corpus-cplm: training: starting (log {log})"]
    log.write_text(log.read_text() + LINE.format(it=20, loss=6.2103, s=10) + "\n")
    assert watcher.poll() == ["[ablate] corpus-cplm: training: iter 20/200 | loss 6.2103 | ETA 0:01:10"]
    assert watcher.poll() == []  # nothing new
    (log.parent / "eval.log").write_text("$ python -m cplm_megatron.evaluate ...\n")
    assert watcher.poll() == [f"[ablate] corpus-cplm: evaluating the checkpoints (log {log.parent / 'eval.log'})"]
    with LogWatcher(tmp_path, every=0.05, say=lambda line: None) as running:  # the thread starts and stops
        time.sleep(0.2)
    assert not running._thread.is_alive()
