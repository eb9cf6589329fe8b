"""Ctrl-C handling of the trainer's StopSignal in a bare process (no torch): the first SIGINT is a request to
checkpoint and stop, the same Ctrl-C arriving twice (terminal + torchrun) is one request, a second Ctrl-C
later stops at once."""
import subprocess
import sys
import textwrap

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
