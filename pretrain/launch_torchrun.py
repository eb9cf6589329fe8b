#!/usr/bin/env python
"""torchrun for supervisors that resume on exit code 75: the workers' exit codes survive, stops checkpoint.

    python pretrain/launch_torchrun.py [torchrun options] pretrain/pretrain_cplm.py --config ... --set ...

Runs `python -m torch.distributed.run` with the same arguments and exits with:
  0   training finished;
  75  stopped with a checkpoint (SIGTERM/SIGINT/SIGHUP/SIGUSR1 to this launcher, train.exit_after_iters,
      or SIGTERM sent to torchrun itself), or stopped before training started: relaunch to resume;
  2   bad input: a config the workers would refuse is one `error:` line from this launcher before torchrun
      starts (keys, values, the layout against the model and the number of processes); later refusals (data,
      checkpoints) are the workers' `error:` line;
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

import contextlib
import io
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


def _option(args: List[str], *names: str) -> Optional[str]:
    """The value of a torchrun option given as `--name value` or `--name=value` (the last one), else None."""
    value = None
    for i, arg in enumerate(args):
        name, eq, rest = arg.partition("=")
        if name in names:
            value = rest if eq else (args[i + 1] if i + 1 < len(args) else None)
    return value


def local_processes(torchrun_args: List[str]) -> Optional[int]:
    """The number of processes torchrun will start on this node, None where torchrun decides (`gpu`, `auto`)."""
    nproc = _option(torchrun_args, "--nproc_per_node", "--nproc-per-node") or "1"
    return int(nproc) if nproc.isdigit() else None


def world_size(torchrun_args: List[str]) -> Optional[int]:
    """The number of processes torchrun will start (nodes x processes per node), None where it is elastic or
    decided by torchrun (`--nnodes 1:4`, `--nproc_per_node gpu|auto`)."""
    nnodes = _option(torchrun_args, "--nnodes") or "1"
    nproc = local_processes(torchrun_args)
    return int(nnodes) * nproc if nnodes.isdigit() and nproc is not None else None


def check_before_spawning(args: List[str]) -> Optional[str]:
    """The training command's config checked here, before torchrun starts any worker: the one error line of a
    config the workers would refuse (every check that needs no process group), else None."""
    script = next((i for i, arg in enumerate(args) if arg.endswith("pretrain_cplm.py")), None)
    if script is None:  # another script, or `-m cplm_megatron.pretrain`: the workers check it
        return None
    from cplm_megatron.errors import UserError
    from cplm_megatron.pretrain import checked_config, parse_args

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a usage error: the workers print it
            options = parse_args(args[script + 1:])
    except SystemExit:
        return None
    if options.print_config:
        return None
    try:
        checked_config(options, world_size(args[:script]))
    except UserError as e:
        return f"error: {e}"
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    refused = check_before_spawning(args)
    if refused:
        print(refused, file=sys.stderr, flush=True)
        return 2
    with tempfile.TemporaryDirectory(prefix="cplm-exit-") as status_dir:
        env = dict(os.environ, **{EXIT_STATUS_DIR_ENV: status_dir})
        if not any(arg.split("=")[0] in _TIMEOUT_SETTINGS for arg in args) and not set(_TIMEOUT_SETTINGS) & set(env):
            env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(SHUTDOWN_TIMEOUT_S)
        if (local_processes(args) or 1) > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default here, without its four-line banner
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
