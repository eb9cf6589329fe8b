"""Start a script's processes warm: forked from a forkserver that imported torch, megatron-core and the project once.

A study or an ablation launches dozens of trainer and evaluator processes, and every fresh interpreter spends
7-20 s importing megatron-core (torch's compile stack) on our 2-core machines. `start_script(script, argv,
nproc, log, env)` runs `script` as `__main__` (what `python SCRIPT ARGV` does) in `nproc` processes forked from
such a server, with torchrun's environment contract when `nproc` > 1 (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT). Each is still a separate process -- its own parallel state, signal handlers, exit code --
in its own process group (or the caller's: `new_session=False`), started in ~20 ms; atexit handlers and
non-daemon threads run at its end as at an interpreter's. Unlike torchrun, a job's exit code is its first
failing rank's own code (torchrun folds every non-zero code into 1), and the other ranks are killed when one
fails. The children run the code the server
imported: `source_changed` tells a caller when the project's files are newer than that.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

# Imported once by the forkserver: modules without import-time state that a job changes (the megatron-core
# fixes are applied per process, by the job's entry point: megatron_patches.setup_compat).
PRELOAD = (
    "cplm_megatron.experiments.launch.forkserver_init", "torch", "torch.distributed", "megatron.core",
    "megatron.core.models.gpt", "megatron.core.optimizer",
    "megatron.core.pipeline_parallel", "megatron.core.dist_checkpointing", "megatron.core.distributed",
    "cplm_megatron.model.builder", "cplm_megatron.training.trainer", "cplm_megatron.training.step",
    "cplm_megatron.data.loader", "streaming", "transformers",
)


_SERVER_STARTED: list = []  # when this process's forkserver was first asked for (the code it preloaded)


def warm_context():
    """The forkserver context; its server starts on first use (one per process) and imports PRELOAD."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # no effect once the server runs
    if not _SERVER_STARTED:
        _SERVER_STARTED.append(time.time())
    return ctx


def _source_files() -> list:
    import cplm_kernels
    import cplm_megatron

    roots = (Path(cplm_megatron.__file__).resolve().parent, Path(cplm_kernels.__file__).resolve().parent)
    return [f for root in roots for f in root.rglob("*.py")]


def source_changed() -> bool:
    """Whether the project's code changed since the forkserver preloaded it: its children would mix the
    preloaded modules with newer files, so such a job must start in a fresh interpreter instead."""
    if not _SERVER_STARTED:
        return False
    return any(f.stat().st_mtime > _SERVER_STARTED[0] for f in _source_files())


def become(env: Dict[str, str]) -> None:
    """In a forked child: take `env` as the whole environment (and what was read from it at import)."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # gettempdir() cached the server's TMPDIR
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))


def redirect_output(out: str, err: str) -> None:
    """In a forked child: file descriptors 1 and 2 append to `out` and `err` (every rank to the same files)."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def run_script_as_main(script: str, argv: List[str], env: Dict[str, str], out: str, err: str, cwd: str,
                       new_session: bool = True, module: bool = False) -> None:
    """A forked child: `script` as `__main__` with `argv`, as `python SCRIPT ARGV` runs it (`module`: the module
    named `script`, as `python -m SCRIPT ARGV`); exits with its code.
    `new_session`: its own process group (as `start_new_session`), else the caller's (a terminal's Ctrl-C
    reaches it, as it reaches a plain subprocess)."""
    if new_session:
        os.setsid()
    redirect_output(out, err)
    become(env)
    os.chdir(cwd)
    sys.argv = [script, *argv]
    code: Any = 0
    try:
        if module:
            runpy.run_module(script, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    code = code if isinstance(code, int) else (0 if code is None else 1)
    threading._shutdown()  # what the interpreter does at exit: non-daemon threads, then atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# The exit code multiprocessing reports for a child of a forkserver that died (a SIGTERM to the runner's whole group):
# the child may still run, reparented; it is waited for until it is gone
FORKSERVER_GONE = 255


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (Linux: /proc; elsewhere: not known, False)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@dataclass
class WarmJob:
    """A script's warm processes, used like subprocess.Popen (pid, poll, wait, returncode, send_signal)."""

    procs: list
    args: List[str]
    stdout_path: Path
    stderr_path: Path
    returncode: Optional[int] = None
    pids: List[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def poll(self) -> Optional[int]:
        codes = [None if c == FORKSERVER_GONE and _alive(p.pid) else c for p, c in
                 ((p, p.exitcode) for p in self.procs)]
        if any(c is None for c in codes):
            if any(c not in (None, 0) for c in codes):  # a dead rank: stop the others, as torchrun does
                time.sleep(2.0)  # let them write their own error first
                self.send_signal(signal.SIGKILL)
                for p in self.procs:
                    p.join()
                codes = [p.exitcode for p in self.procs]
            else:
                return None
        bad = [c for c in codes if c != 0]
        self.returncode = bad[0] if bad else 0
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The job's exit code; subprocess.TimeoutExpired after `timeout` seconds (the processes keep running)."""
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """To every rank's process group (what `kill` of the job does)."""
        for p in self.procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):  # not yet its own group (before setsid) or gone
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass


def start_script(script: str | Path, argv: Sequence[str], nproc: int, out: Path, err: Optional[Path] = None,
                 env: Optional[Dict[str, str]] = None, extra_env: Optional[Dict[str, str]] = None,
                 cwd: Optional[str | Path] = None, launcher_vars: Optional[bool] = None,
                 new_session: bool = True, module: bool = False) -> WarmJob:
    """`nproc` warm processes running `script` with `argv`; stdout to `out`, stderr to `err` (default: `out`).
    Their environment: `env` (default: this process's), torchrun's variables (with `nproc` > 1, or when
    `launcher_vars`), then `extra_env`. `new_session`: each in its own process group (see run_script_as_main).
    `module`: `script` is a module name, run as `python -m` runs it.
    """
    from cplm_megatron.parallel.distributed import free_port

    ctx = warm_context()
    err = err or out
    Path(out).touch()
    Path(err).touch()
    base = dict(os.environ if env is None else env)
    port = free_port()
    procs = []
    for rank in range(nproc):
        launcher = {} if not (nproc > 1 if launcher_vars is None else launcher_vars) else {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        rank_env = {**base, **launcher, **(extra_env or {})}
        p = ctx.Process(target=run_script_as_main,
                        args=(str(script), list(argv), rank_env, str(out), str(err), str(cwd or os.getcwd()),
                              new_session, module))
        p.start()
        procs.append(p)
    return WarmJob(procs, [str(script), *argv], Path(out), Path(err))


def start_module(module: str, argv: Sequence[str], nproc: int, out: Path, **kwargs: Any) -> WarmJob:
    """`python -m MODULE ARGV` in `nproc` warm processes (start_script's other arguments)."""
    return start_script(module, argv, nproc, out, module=True, **kwargs)
