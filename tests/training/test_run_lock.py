"""One run per run dir (cplm_megatron/training/run_lock.py): a live holder refuses a second launch with one line,
a dead holder (kill -9) or a silent one on another host is taken over (issue 30 item 2)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cplm_megatron.errors import ConfigError
from cplm_megatron.training import run_lock
from cplm_megatron.training.run_lock import RunLock
from tests import harness
from tests.harness import REPO, process_env

HOLD = ("import sys, time\nfrom cplm_megatron.training.run_lock import RunLock\n"
        "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)")


def _holder(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env=process_env({"SLURM_JOB_ID": "4242"}))
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_live_holder_refuses_and_a_killed_one_is_taken_over(tmp_path):
    holder = _holder(tmp_path / "run")
    try:
        with pytest.raises(ConfigError, match=rf"in use by a live run \(host .*, pid {holder.pid}, job 4242"):
            RunLock(tmp_path / "run").acquire()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        lock = RunLock(tmp_path / "run")
        note = lock.acquire()
        assert "took over" in note and f"pid {holder.pid} is no longer running" in note
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
        lock.release()
        assert not lock.path.exists()
    finally:
        holder.kill()
        holder.wait()


def test_another_hosts_lock_is_stale_only_without_heartbeat(tmp_path):
    path = tmp_path / run_lock.LOCK_NAME
    path.write_text(json.dumps({"host": "node-17", "pid": 1234, "start": "1", "job_id": "77", "since": 0}))
    with pytest.raises(ConfigError, match=r"host node-17, pid 1234, job 77"):
        RunLock(tmp_path).acquire()
    old = time.time() - run_lock.STALE_AFTER_S - 5
    os.utime(path, (old, old))
    lock = RunLock(tmp_path)
    assert "no heartbeat for" in lock.acquire()
    lock.release()


def test_a_requeued_slurm_job_takes_over_its_previous_incarnations_lock_at_once(tmp_path, monkeypatch):
    """A requeue keeps the job id and may land on another node: its fresh heartbeat must not refuse the job."""
    path = tmp_path / run_lock.LOCK_NAME
    path.write_text(json.dumps({"host": "node-17", "pid": 1234, "start": "1", "job_id": "77", "since": 0}))
    monkeypatch.setenv("SLURM_JOB_ID", "78")  # another job: refused while the heartbeat is fresh
    with pytest.raises(ConfigError, match="in use by a live run"):
        RunLock(tmp_path).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    lock = RunLock(tmp_path)
    assert "previous incarnation (job 77, requeued)" in lock.acquire()
    lock.release()


class _SlowJson:
    """json for run_lock with a 2 s pause in writing the record (as a loaded filesystem or a descheduled process
    gives): the window in which a lock created before its record is complete was taken over as unreadable."""

    loads = staticmethod(json.loads)

    @staticmethod
    def dump(*args, **kwargs):
        time.sleep(2)
        return json.dump(*args, **kwargs)

    @staticmethod
    def dumps(*args, **kwargs):
        time.sleep(2)
        return json.dumps(*args, **kwargs)


def _take(run_dir: str, slow: bool, results) -> None:
    """In a forked process: try to take the lock (its record written slowly if `slow`), report, hold it 4 s."""
    if slow:
        run_lock.json = _SlowJson
    lock = RunLock(run_dir)
    try:
        lock.acquire()
        results.put(("held", os.getpid()))
    except ConfigError as e:
        results.put(("refused", str(e)))
        return
    time.sleep(4)
    lock.release()


def test_a_lock_whose_record_is_still_being_written_is_not_taken_over(tmp_path):
    """Two launches, the first one's record delayed 2 s: exactly one holds the lock (both did: issue 43 item 4)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    first = ctx.Process(target=_take, args=(str(tmp_path / "run"), True, results))
    first.start()
    time.sleep(0.5)
    second = ctx.Process(target=_take, args=(str(tmp_path / "run"), False, results))
    second.start()
    outcomes = sorted([results.get(timeout=30), results.get(timeout=30)])
    for p in (first, second):
        p.join(timeout=30)
    assert [o[0] for o in outcomes] == ["held", "refused"], outcomes
    assert f"in use by a live run (host {os.uname().nodename}, pid {outcomes[0][1]}" in outcomes[1][1]


def test_an_empty_lock_is_live_until_it_is_old_and_a_directory_is_one_line(tmp_path):
    path = tmp_path / run_lock.LOCK_NAME
    path.write_text("")
    with pytest.raises(ConfigError, match=r"run.lock is empty and \d+ s old: another launch may be writing it"):
        RunLock(tmp_path).acquire()
    path.write_text('{"host": "node-1", "pi')
    with pytest.raises(ConfigError, match=r"run.lock is partial"):
        RunLock(tmp_path).acquire()
    old = time.time() - run_lock.STALE_AFTER_S - 5
    os.utime(path, (old, old))
    lock = RunLock(tmp_path)
    assert "it holds no record and is" in lock.acquire()
    lock.release()
    path.mkdir()
    with pytest.raises(ConfigError, match=rf"{path} is not a lock file \(a directory or a special file\); remove it"):
        RunLock(tmp_path).acquire()


def test_a_refused_launch_leaves_no_new_run_dir(tmp_path):
    lock = RunLock(tmp_path / "new")
    lock.acquire()
    lock.release()
    assert not (tmp_path / "new").exists()


@pytest.mark.mcore
@pytest.mark.slow  # the lock's refusal by a real launch: the pinned megatron-core's leg only
@pytest.mark.usefixtures("isolated_streaming")
def test_a_second_launch_into_a_live_runs_dir_exits_2_in_seconds_and_the_holders_files_stay(stdlib_corpus,
                                                                                            tmp_path):
    from tests.training import pretrain_utils as pu

    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        (run_dir / "metrics.jsonl").write_text('{"iteration": 1}\n')
        before = pu.files_of(run_dir)
        started = time.monotonic()
        second = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 2))
        assert time.monotonic() - started < 60
        pu.assert_bad_input(second, "is in use by a live run", f"pid {holder.pid}", "job 4242")
        assert pu.files_of(run_dir) == before
    finally:
        holder.kill()
        holder.wait()
    again = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, 2, **{"checkpoint.interval": 2}))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "took over" in again.stdout and not (run_dir / run_lock.LOCK_NAME).exists()


@pytest.mark.mcore
@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_two_real_launches_into_one_run_dir_the_first_finishes_intact(stdlib_corpus, tmp_path):
    """A double-submitted job: the second trainer exits 2 within seconds while the first trains on and finishes
    with every checkpoint and one metrics record per iteration; a first trainer killed with -9 is taken over."""
    from tests.training import pretrain_utils as pu

    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, 150, **{"checkpoint.interval": 50, "checkpoint.keep": 3,
                                                                   "train.log_interval": 10})
    first = pu.start(1, overrides, tmp_path / "first.log")
    try:
        pu.wait_for(lambda: len(pu.losses(run_dir)) >= 1, proc=first)  # the first holds the lock and trains
        started = time.monotonic()
        second = pu.run(1, overrides)
        assert time.monotonic() - started < 60
        pu.assert_bad_input(second, "is in use by a live run", f"pid {first.pid}")
        assert first.poll() is None, "the first run ended before the second was refused: lengthen it"
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        harness.kill_group(first)
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*")) == [
        "iter_0000050", "iter_0000100", "iter_0000150"]
    iterations = [r["iteration"] for r in pu.metrics(run_dir) if "loss" in r]
    assert iterations == list(range(10, 151, 10))  # one writer: no interleaved records
    assert not (run_dir / run_lock.LOCK_NAME).exists()

    killed_dir = tmp_path / "killed"
    killed = pu.start(1, pu.tiny_overrides(stdlib_corpus, killed_dir, 300, **{"checkpoint.interval": 100}),
                      tmp_path / "killed.log")
    pu.wait_for(lambda: len(pu.losses(killed_dir)) >= 1, proc=killed)
    harness.kill_group(killed, signal.SIGKILL)
    again = pu.run(1, pu.tiny_overrides(stdlib_corpus, killed_dir, 4, **{"checkpoint.interval": 2}))
    assert again.returncode == 0 and "took over" in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
