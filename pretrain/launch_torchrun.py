#!/usr/bin/env python
"""torchrun for supervisors that resume on exit code 75: the workers' exit codes survive, stops checkpoint.

    python pretrain/launch_torchrun.py [torchrun options] pretrain/pretrain_cplm.py --config ... --set ...

Runs `python -m torch.distributed.run` with the same arguments and exits with:
  0   training finished;
  75  stopped with a checkpoint (SIGTERM/SIGINT/SIGHUP/SIGUSR1 to this launcher, train.exit_after_iters,
      or SIGTERM sent to torchrun itself), or stopped before training started: relaunch to resume;
  2   bad input (every worker printed one `error:` line);
  else torchrun's code (1: a failure).

Plain torchrun exits 1 for all of these (it reports any worker exit other than 0 as a failure, and a
SIGTERM as a SignalException). Here torchrun runs in its own session, so signals meant for the job reach
this launcher only; the first stop signal is forwarded to the training workers as SIGUSR1 (they save a
checkpoint at the next step boundary and exit 75, with no torchrun shutdown timeout racing the save); a
second one stops torchrun at once (SIGTERM: the work since the last checkpoint is lost). A SIGTERM sent
to torchrun directly reaches the workers through torchrun, which kills them after its shutdown timeout:
unless one is set (--shutdown-timeout, TORCH_ELASTIC_SHUTDOWN_TIMEOUT) it is raised here from 30 s to
SHUTDOWN_TIMEOUT_S, time for the step and the save. The workers record their exit codes in a temporary
directory (`CPLM_EXIT_STATUS_DIR`). One launcher per node.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import List, Optional

from cplm_megatron.training.exit_status import (
    EXIT_STATUS_DIR_ENV,
    launcher_exit_code,
    read_exit_statuses,
)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
SHUTDOWN_TIMEOUT_S = 300
_TIMEOUT_SETTINGS = ("--shutdown-timeout", "--shutdown_timeout", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SHUTDOWN_TIMEOUT")


def _die_with_parent() -> None:
    """In the torchrun child (Linux): SIGTERM when this launcher dies, so a killed launcher leaves no job behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _workers(torchrun_pid: int) -> List[int]:
    """torchrun's worker processes (its children that carry a LOCAL_RANK)."""
    import psutil

    try:
        children = psutil.Process(torchrun_pid).children()
    except psutil.NoSuchProcess:
        return []
    workers = []
    for child in children:
        try:
            if "LOCAL_RANK" in child.environ():
                workers.append(child.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return workers


class _Forwarder:
    """Signal handler: the first stop signal becomes SIGUSR1 to the workers, a later one SIGTERM to torchrun."""

    def __init__(self, torchrun: subprocess.Popen):
        self.torchrun = torchrun
        self.stop_requested = False

    def __call__(self, signum: int, frame) -> None:  # noqa: ARG002 - signal handler signature
        name = signal.Signals(signum).name
        if not self.stop_requested:
            self.stop_requested = True
            workers = _workers(self.torchrun.pid)
            if workers:
                print(f"[launch_torchrun] {name}: asking {len(workers)} workers to checkpoint and stop (SIGUSR1)",
                      file=sys.stderr, flush=True)
                for pid in workers:
                    _send(pid, signal.SIGUSR1)
                return
            print(f"[launch_torchrun] {name} before the workers started: stopping torchrun",
                  file=sys.stderr, flush=True)
        else:
            print(f"[launch_torchrun] {name} again: stopping torchrun now (SIGTERM)", file=sys.stderr, flush=True)
        _send(self.torchrun.pid, signal.SIGTERM)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    with tempfile.TemporaryDirectory(prefix="cplm-exit-") as status_dir:
        env = dict(os.environ, **{EXIT_STATUS_DIR_ENV: status_dir})
        if not any(arg.split("=")[0] in _TIMEOUT_SETTINGS for arg in args) and not set(_TIMEOUT_SETTINGS) & set(env):
            env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(SHUTDOWN_TIMEOUT_S)
        torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        forward = _Forwarder(torchrun)
        previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            torchrun_code = torchrun.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        statuses = read_exit_statuses(status_dir)
    code = launcher_exit_code(statuses, torchrun_code, forward.stop_requested)
    if code != torchrun_code:
        print(f"[launch_torchrun] torchrun exited {torchrun_code}; workers: "
              f"{dict(sorted(statuses.items())) or 'none reported'}; exit code {code}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
