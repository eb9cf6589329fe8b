"""The ablation's progress while its jobs run: each run's latest step, loss and ETA with the log it comes from,
printed once per change; reused runs' old logs stay quiet; which run of how many, and the overall ETA."""
from __future__ import annotations

import os
import time
from pathlib import Path

from cplm_megatron.experiments.launch.launcher import JobResult
from cplm_megatron.experiments.progress import LogWatcher, RunProgress
from cplm_megatron.experiments.run import Evaluation, Run

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


def _job(name: str, reused: bool = False, seconds: tuple[float, float] = (0.0, 0.0)) -> JobResult:
    iters, interval, kind = RUNS[name]
    spec = Run(name=name, group=name, settings=(("train.iters", iters), ("checkpoint.interval", interval)),
               evaluation=Evaluation(tasks=("val",)), experiment=kind)
    return JobResult(spec=spec, run_dir=Path(name), train_seconds=seconds[0], eval_seconds=seconds[1], reused=reused)


# name: (steps, checkpoint interval, experiment); every checkpoint is evaluated, the untrained model too
RUNS = {"corpus-baseline": (200, 100, "corpus"), "corpus-cplm": (200, 100, "corpus"),
        "spamlang-baseline": (20, 5, "spamlang"), "spamlang-cplm": (20, 5, "spamlang"),
        "spamlang-seed2": (20, 5, "spamlang")}


def test_progress_says_which_run_of_how_many_and_the_overall_eta(tmp_path: Path):
    """A run left costs its steps at the seconds per step and its checkpoints at the seconds per evaluation of its
    experiment's finished runs (any experiment's before one of its own finished; reused runs cost nothing)."""
    progress = RunProgress([_job(name).spec for name in RUNS])
    progress.finish(_job("spamlang-cplm", reused=True))
    assert progress.eta() is None and progress.note() == ""  # no run trained yet: no rate
    watcher = LogWatcher(tmp_path, every=0, progress=progress)
    progress.finish(_job("corpus-baseline", seconds=(100.0, 30.0)))  # 0.5 s per step, 10 s per checkpoint (3)
    # corpus-cplm 200 x 0.5 + 3 x 10; two spamlang runs at the corpus rates: 2 x (20 x 0.5 + 5 x 10)
    assert progress.position("corpus-cplm") == "run 2 of 5" and progress.eta() == 130 + 2 * 60
    log = tmp_path / "corpus-cplm" / "train.log"
    log.parent.mkdir()
    log.write_text(LINE.format(it=100, loss=6.2103, s=10) + "\n")
    assert watcher.poll() == ["[ablate] run 2 of 5, corpus-cplm: training: iter 100/200 | loss 6.2103 | ETA 0:01:10; "
                              f"overall ETA 0:03:20 (log {log})"]  # 100 steps trained: 80 + 120 s
    (log.parent / "eval.log").write_text("$ python -m cplm_megatron.evaluate ...\n")
    assert watcher.poll()[0].startswith("[ablate] run 2 of 5, corpus-cplm: evaluating the checkpoints; "
                                        "overall ETA 0:02:30 (log ")  # its 200 steps done: 30 + 120 s
    result = _job("corpus-cplm", seconds=(100.0, 30.0))
    progress.finish(result)
    result.progress = (progress.position("corpus-cplm"), progress.note())
    assert result.status_line() == "run 2 of 5, corpus-cplm: done (train 100 s, eval 30 s); overall ETA 0:02:00"
    progress.finish(_job("spamlang-baseline", seconds=(40.0, 50.0)))  # spamlang's own: 2 s per step, 10 s per checkpoint
    assert progress.eta() == 20 * 2 + 5 * 10
