"""The session-end check (tests/session_processes.py) finds what a test left running: a child it did not stop, and an
orphan reparented away from the session (as megatron's Manager was after its trainer was killed)."""
import os
import subprocess
import time

from tests.session_processes import MARK, survivors


def test_a_left_child_and_a_reparented_orphan_are_found_and_helpers_spared():
    child = subprocess.Popen(["sleep", "60"])
    spawner = subprocess.run(["sh", "-c", "sleep 61 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    orphan = int(spawner.stdout)  # its shell exited: reparented, like a killed trainer's helpers
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and orphan not in [s.pid for s in survivors(os.environ[MARK], os.getpid())]:
            time.sleep(0.05)
        found = {s.pid: s for s in survivors(os.environ[MARK], os.getpid())}
        assert child.pid in found and found[child.pid].command == "sleep 60"
        assert orphan in found and found[orphan].parent != os.getpid()
        unmarked = subprocess.Popen(["sleep", "62"], env={"PATH": os.environ["PATH"]})  # started outside the mark
        assert unmarked.pid not in [s.pid for s in survivors(os.environ[MARK], os.getpid())]
        unmarked.kill()
        unmarked.wait()
    finally:
        child.kill()
        child.wait()
        os.kill(orphan, 9)
