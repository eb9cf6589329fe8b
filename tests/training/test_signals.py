"""Ctrl-C handling of the trainer's StopSignal in a bare process (no torch): the first SIGINT is a request to
checkpoint and stop, the same Ctrl-C arriving twice (terminal + torchrun) is one request, a second Ctrl-C
later stops at once."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.training.pretrain_utils import REPO

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from cplm_megatron.training.signals import REPEAT_AFTER_S, StopSignal, defer_stop_signals
    defer_stop_signals()
    os.kill(os.getpid(), signal.SIGINT)  # during start-up: deferred, not lost
    stop = StopSignal()
    assert stop.received == signal.SIGINT, stop.received
    os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C forwarded by torchrun: still one request
    print("still running", flush=True)
    time.sleep(REPEAT_AFTER_S + 0.2)
    os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C
    time.sleep(5)
    print("not stopped", flush=True)
""")


def test_a_second_ctrl_c_stops_at_once_and_a_forwarded_copy_does_not():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 130, proc.stdout + proc.stderr  # 128 + SIGINT
    assert proc.stdout == "still running\n"
    assert "SIGINT: saving a checkpoint at the next step boundary" in proc.stderr
    assert "SIGINT again: stopping now, without a checkpoint" in proc.stderr


AFTER_THE_STOP = textwrap.dedent("""
    import os, signal, sys, time
    from cplm_megatron.training.signals import REPEAT_AFTER_S, StopSignal
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own: KeyboardInterrupt
    stop = StopSignal()
    os.kill(os.getpid(), signal.SIGINT)  # the stop request: the trainer saves and returns 75
    time.sleep(REPEAT_AFTER_S + 0.2)
    stop.restore()  # the trainer's finally: the process is on its way out (joins helpers, tears down)
    print("restored", flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C during that exit
    time.sleep(5)
    print("not stopped", flush=True)
""")


def test_a_second_ctrl_c_while_a_stopped_run_exits_is_130_without_a_traceback():
    """A second Ctrl-C after the stop's checkpoint is saved, while the process exits (joins megatron's Manager,
    tears down its process groups), raised KeyboardInterrupt there (the previous handler was back): the process
    died of SIGINT. It stops at once with 130 and one line now."""
    proc = subprocess.run([sys.executable, "-c", AFTER_THE_STOP], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 130 and proc.stdout == "restored\n", proc.stdout + proc.stderr
    assert proc.stderr.rstrip().endswith("[train] SIGINT again: stopping now, its checkpoint is saved"), proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr


HUP_QUIT = textwrap.dedent("""
    import os, signal, sys, time
    from cplm_megatron.training.signals import StopSignal, stop_received
    if sys.argv[1] == "nohup":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does before it starts the trainer
    stop = StopSignal()
    def settle(seconds):  # until a signal is recorded, or `seconds` (under load its handling may take a while)
        deadline = time.monotonic() + seconds
        while stop.received is None and time.monotonic() < deadline:
            time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGHUP)
    settle(0.5 if sys.argv[1] == "nohup" else 30)  # ignored: nothing comes (QUIT below shows it never did)
    print("after HUP:", stop.received, flush=True)
    os.kill(os.getpid(), signal.SIGQUIT)
    settle(30)
    print("after QUIT:", stop.received, stop_received(), flush=True)
""")


def _as_a_shell_starts_it() -> None:
    """A child's start as from a terminal: no signal blocked or ignored (a suite worker's process may hold a mask
    an in-process test left: QUIT stayed pending in one full-suite run)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


def test_sighup_and_sigquit_are_stop_requests_unless_the_run_was_started_with_nohup():
    """A closed terminal (HUP) or Ctrl-\\ (QUIT) killed the trainer without a checkpoint (exit 129/131): they are
    stop requests now, and nohup's ignored HUP stays ignored."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    plain = subprocess.run([sys.executable, "-c", HUP_QUIT, "plain"], cwd=REPO, capture_output=True, text=True,
                           timeout=60, env=env, preexec_fn=_as_a_shell_starts_it)
    assert plain.returncode == 0 and plain.stdout == "after HUP: 1\nafter QUIT: 1 1\n", plain.stdout + plain.stderr
    nohup = subprocess.run([sys.executable, "-c", HUP_QUIT, "nohup"], cwd=REPO, capture_output=True, text=True,
                           timeout=60, env=env, preexec_fn=_as_a_shell_starts_it)
    assert nohup.returncode == 0 and nohup.stdout == "after HUP: None\nafter QUIT: 3 3\n", nohup.stdout + nohup.stderr


ORPHANED_WORKER = textwrap.dedent("""
    import os, sys, time
    r, w = os.pipe()
    if os.fork():  # torchrun: dies (as under kill -9) once its worker watches it
        os.read(r, 1)
        os._exit(0)
    os.environ[sys.argv[2]] = "test"  # a torchrun worker, or a study launcher's job
    from cplm_megatron.training.signals import StopSignal
    stop = StopSignal()
    stop.boundaries = int(sys.argv[1])  # step boundaries reached: 0 = still starting up
    os.write(w, b"x")
    deadline = time.time() + 20
    while stop.received is None and time.time() < deadline:
        time.sleep(0.05)
    print("worker stop request:", stop.received, flush=True)
""")


def _orphaned_worker(boundaries: int, launched_by: str = "TORCHELASTIC_RUN_ID") -> str:
    """The output of the worker whose launcher died (its stdout outlives its parent); `launched_by`: the variable
    that tells it who its parent is."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        with open(out, "w") as f:
            subprocess.run([sys.executable, "-c", ORPHANED_WORKER, str(boundaries), launched_by], cwd=REPO, stdout=f,
                           stderr=subprocess.STDOUT, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        deadline = time.time() + 30
        while time.time() < deadline and "worker stop request" not in open(out).read() \
                and "exiting 75" not in open(out).read():
            time.sleep(0.05)
        time.sleep(0.2)
        return open(out).read()


def test_a_torchrun_worker_stops_when_torchrun_is_gone():
    """kill -9 of a plain torchrun left its workers training (and the run lock then refused the relaunch): a worker
    that trains stops as on SIGTERM (checkpoint, 75); one still starting up (it may wait forever for torchrun's
    rendezvous store) exits 75 at once."""
    training = _orphaned_worker(1)
    assert "worker stop request: 15\n" in training and ") is gone: stopping as on SIGTERM" in training, training
    starting = _orphaned_worker(0)
    assert ") is gone before the first step: exiting 75 (relaunch to resume)" in starting, starting
    assert "worker stop request" not in starting


def test_a_study_job_stops_when_its_launcher_is_gone():
    """A study runner killed (or its forkserver with it) left its trainer training on with ppid 1, writing into its
    run dir: a job the launcher marks (WATCH_LAUNCHER_ENV) watches its parent as a torchrun worker does."""
    from cplm_megatron.training.signals import WATCH_LAUNCHER_ENV

    training = _orphaned_worker(1, WATCH_LAUNCHER_ENV)
    assert "worker stop request: 15\n" in training, training
    assert "[train] the launcher (pid " in training and ") is gone: stopping as on SIGTERM" in training, training


LATE_HANDLERS = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from cplm_megatron.training.signals import STOP_SIGNALS, StopSignal
    stop = StopSignal()
    signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))  # the main thread in a long wait (a save's end)
    subprocess.Popen([sys.executable, "-c", "import os, signal, sys, time; pid = int(sys.argv[1]); "
                      "os.kill(pid, signal.SIGTERM); time.sleep(1.5); os.kill(pid, signal.SIGINT)", str(os.getpid())])
    time.sleep(4)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))  # its handlers run now, SIGINT first
    time.sleep(0.5)
    print("not stopped:", stop.received, flush=True)
""")


def test_a_second_signal_counts_from_when_it_arrived_not_when_the_main_thread_handled_it():
    """A SIGTERM, then a Ctrl-C 1.5 s later, while the main thread waits (an async save's shutdown): both were
    handled when the wait ended, SIGINT first, and counted as one request (checkpoint, exit 75). Their arrival
    times count: the second stops the process at once (130)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", LATE_HANDLERS], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "SIGINT again: stopping now, without a checkpoint" in proc.stderr and not proc.stdout, proc.stderr
    assert time.monotonic() - started < 30
