"""No orphans (issue 30 item 5, issue 43 item 5): a trainer killed with -9 mid-run leaves none of its helper processes
alive, with async saves and with the default synchronous ones (megatron's spawned Manager, started by the first save,
used to live on, parent 1, for an hour); SIGHUP stops like SIGTERM (checkpoint, exit 75); and the worker of a plain
torchrun killed with -9 stops instead of training on alone."""
import json
import os
import re
import signal
import time

import psutil
import pytest

from cplm_megatron.checkpoint.lookup import read_latest
from cplm_megatron.training.signals import RESUME_EXIT_CODE
from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


def _alive(processes):
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _wait_gone(processes, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(processes):
        time.sleep(0.2)
    return _alive(processes)


@pytest.mark.parametrize("async_save, mode", [("true", "warm"), ("false", "python")], ids=["async", "sync"])
def test_kill_9_of_a_saving_trainer_leaves_no_process_behind(stdlib_corpus, tmp_path, async_save, mode):
    """The sync case runs in its own interpreter, where multiprocessing's resource tracker is the trainer's child
    too (a warm process shares the test session's): it exits once the Manager holding it is killed."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{
        "checkpoint.async_save": async_save, "checkpoint.interval": 2}), log, mode=mode)
    try:
        pu.wait_for(lambda: log.exists() and "saved" in log.read_text(), timeout=300)
        trainer = psutil.Process(proc.pid if mode == "python" else pu.worker_pids(proc)[0])
        helpers = trainer.children(recursive=True)
        commands = [" ".join(h.cmdline()) for h in helpers]
        assert any("spawn_main" in c for c in commands), commands  # megatron's Manager
        assert mode == "warm" or any("resource_tracker" in c for c in commands), commands
        os.kill(trainer.pid, signal.SIGKILL)
        alive = _wait_gone(helpers)
        assert not alive, [(h.pid, h.cmdline()) for h in alive]
    finally:
        pu.kill_group(proc)


def test_sighup_checkpoints_and_exits_75_leaving_no_process(stdlib_corpus, tmp_path):
    """A closed terminal or ssh session (SIGHUP) killed the trainer without a checkpoint (exit 129) and left its
    Manager and resource tracker behind."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{"checkpoint.interval": 2}), log)
    try:
        pu.wait_for(lambda: log.exists() and "saved" in log.read_text(), timeout=300)
        trainer = psutil.Process(pu.worker_pids(proc)[0])
        helpers = trainer.children(recursive=True)
        os.kill(trainer.pid, signal.SIGHUP)
        proc.wait(timeout=120)
        assert proc.returncode == RESUME_EXIT_CODE, log.read_text()[-3000:]
        stopped = read_latest(run_dir / "checkpoints")
        it = json.loads((stopped / "cplm_state.json").read_text())["iteration"]
        assert f"[train] stopping at iteration {it} (signal {int(signal.SIGHUP)}); exit code 75" in log.read_text()
        alive = _wait_gone(helpers)
        assert not alive, [(h.pid, h.cmdline()) for h in alive]
    finally:
        pu.kill_group(proc)


def test_killing_a_plain_torchrun_stops_its_worker_with_a_checkpoint(stdlib_corpus, tmp_path):
    """kill -9 of torchrun left its workers training (and the run lock refused the relaunch): a worker notices its
    launcher is gone within a second and stops as on SIGTERM."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, 200, **{"checkpoint.interval": 0}), log,
                    mode="torchrun")
    try:
        pu.wait_for(lambda: max(pu.losses(run_dir), default=0) >= 2, proc=proc)
        workers = [psutil.Process(pid) for pid in pu.worker_pids(proc)]
        os.kill(proc.pid, signal.SIGKILL)  # torchrun only: its worker is left behind
        alive = _wait_gone(workers, timeout=120)
        assert not alive, log.read_text()[-3000:]
        text = log.read_text()
        assert f"[train] torchrun (pid {proc.pid}) is gone: stopping as on SIGTERM" in text, text[-3000:]
        stopped = read_latest(run_dir / "checkpoints")
        assert stopped is not None, text[-3000:]
        it = json.loads((stopped / "cplm_state.json").read_text())["iteration"]
        assert f"[train] stopping at iteration {it} (signal {int(signal.SIGTERM)}); exit code 75" in text
    finally:
        pu.kill_group(proc)


def test_a_second_signal_while_an_async_save_shuts_down_exits_130_at_once(stdlib_corpus, tmp_path):
    """SIGTERM to the run's process group, then SIGINT 1.5 s later, while the stop's async save starts megatron's
    Manager and finishes: the Manager printed a KeyboardInterrupt traceback and the trainer exited 75 (the two
    signals, handled together after a long wait of the main thread, counted as one request). Now the second signal
    ends the run at once: exit 130, one line, no traceback, no process left (the save may have finished by then:
    the same outcome during the exit, tests/training/test_signals.py)."""
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    proc = pu.start(1, pu.tiny_overrides(stdlib_corpus, run_dir, 400, **{
        "checkpoint.async_save": "true", "checkpoint.interval": 1000}), log, mode="python")
    try:
        pu.wait_for(lambda: len(pu.losses(run_dir)) >= 2, timeout=300, proc=proc)
        helpers = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(1.5)
        helpers += psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)
        stopped = time.monotonic()
        proc.wait(timeout=120)
        seconds = time.monotonic() - stopped
        alive = _wait_gone(helpers)
    finally:
        pu.kill_group(proc)
    text = log.read_text()
    assert seconds < 10, (seconds, text[-3000:])
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    if proc.returncode == -signal.SIGINT:  # it came in the interpreter's own teardown (no Python handler runs
        # there), after the run had stopped with its checkpoint; a shell reports 130, the launchers the recorded 75
        assert f"exit code {RESUME_EXIT_CODE} = resume me" in text and read_latest(run_dir / "checkpoints"), text
    else:  # during the save (the stop's checkpoint unfinished) or after it, while the process exits
        assert proc.returncode == 130, text[-3000:]
        assert re.search(r"\n\[train\] SIGINT again: stopping now, (without a checkpoint|its checkpoint is saved)$",
                         text.rstrip()), text[-3000:]
    assert not alive, [(h.pid, h.cmdline()) for h in alive]
