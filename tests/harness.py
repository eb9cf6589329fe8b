"""The one test harness: every test that starts processes starts them here.

* `process_env`: the environment of every child (one thread, wandb offline, no hub, the test's TMPDIR).
* `run_distributed(fn, world_size, *args)`: fn(rank, *args) in `world_size` real processes joined by
  gloo on 127.0.0.1 (megatron-core's parallel state is set up by `fn`, through `init_distributed`);
  `run_cases` runs many such calls in one process group, tearing megatron's parallel state down between.
  `run_processes` is the same without megatron (the data layer's tests: no RANK/WORLD_SIZE environment).
* `pretrain_command`, `run_pretrain`, `start_pretrain`: pretrain/pretrain_cplm.py as a user starts it
  (`python`, `torchrun`, `pretrain/launch_torchrun.py`) or as `warm` processes (below).
* `run_tool`: a tools/*.py command line in a subprocess.

Warm processes. `import megatron.core` costs 7-20 s per interpreter on our 2-core machines, and the suite
starts hundreds of processes. Workers therefore fork from a multiprocessing forkserver that imported torch,
megatron-core and the project once per session (cplm_megatron/experiments/launch/warm.py, which the study and
ablation jobs use too): each is still a separate
process (its own parallel state, signals, exit code, kill -9), started in ~20 ms. A `warm` pretrain run
is pretrain_cplm.py executed as `__main__` in such processes with torchrun's environment contract
(RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT); what only an interpreter or a launcher shows (start-up
warnings, torchrun's exit codes and signal forwarding) is tested with the `python`/`torchrun`/`launcher` modes.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from cplm_megatron.experiments.launch.warm import WarmJob, become, redirect_output, start_script, warm_context
from cplm_megatron.parallel.distributed import free_port

REPO = Path(__file__).resolve().parents[1]
PRETRAIN = REPO / "pretrain" / "pretrain_cplm.py"
LAUNCHER = REPO / "pretrain" / "launch_torchrun.py"
TINY_RECIPE = REPO / "configs" / "tiny.yaml"
PROCESS_TIMEOUT_S = 600


def process_env(extra: Optional[Dict[str, str]] = None, tmpdir: Optional[str] = None) -> Dict[str, str]:
    """The environment of every child: one compute thread, unbuffered output, no network services."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="offline",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONWARNINGS="ignore",
               TMPDIR=tmpdir or tempfile.gettempdir())
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------------------------- functions
@dataclass
class Call:
    """One case of a process group: fn(rank, *args), under `name` in the results."""
    name: str
    fn: Callable
    args: Tuple = ()


def _reset_megatron() -> None:
    """Between cases: megatron's parallel state and global buffers go, the default process group stays."""
    import sys as _sys

    if "megatron.core" not in _sys.modules:
        return
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    from megatron.core import num_microbatches_calculator as nmc

    nmc.destroy_num_microbatches_calculator()


def _case_worker(rank: int, calls: Sequence[Call], world_size: int, port: int, out_dir: str, env: dict,
                 init_group: bool, capture: bool = False, compat: bool = True) -> None:
    if capture:  # the rank's output to files the parent reads (a test asserting on what a process prints)
        redirect_output(os.path.join(out_dir, "stdout"), os.path.join(out_dir, "stderr"))
    env = dict(env, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if not init_group:  # the data layer must work without the launcher's variables
        env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    become(env)
    import torch.distributed as dist

    if init_group and compat:  # the worker is the entry point of the megatron tests' processes
        from cplm_megatron.parallel.megatron_patches import setup_compat

        setup_compat()
    if not init_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    failed = False
    for call in calls:
        try:
            result = ("ok", call.fn(rank, *call.args))
        except BaseException as e:  # report to the parent instead of hanging the others
            result = ("error", f"rank {rank}, case {call.name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            failed = True
            if capture:
                traceback.print_exc()
        with open(os.path.join(out_dir, f"{call.name}.rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
        if failed:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)  # the other ranks may wait in a collective: the parent stops them
        _reset_megatron()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()


def _join(procs: list, timeout: float) -> None:
    """Wait for every process; on the first failure (or the timeout) stop the others and raise."""
    deadline = time.time() + timeout
    while any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
            time.sleep(1.0)  # let a failing rank's peers write their own error first
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join()
            break
        time.sleep(0.02)
    for p in procs:
        p.join()


def run_cases(calls: Sequence[Call], world_size: int, env: Optional[dict] = None, init_group: bool = True,
              timeout: float = PROCESS_TIMEOUT_S, compat: bool = True) -> Dict[str, List[Any]]:
    """Every call in turn in one group of `world_size` warm processes: {name: per-rank results}.
    A failing case raises here with every rank's error; the cases after it do not run. The processes apply
    the megatron-core patch layer first, as the entry points do (`compat=False`: the compat tests apply it themselves)."""
    names = [c.name for c in calls]
    assert len(set(names)) == len(names), names
    ctx = warm_context()
    with tempfile.TemporaryDirectory() as out_dir:
        port = free_port()
        procs = [ctx.Process(target=_case_worker, args=(r, list(calls), world_size, port, out_dir, process_env(env),
                                                        init_group, False, compat))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        _join(procs, timeout)
        results: Dict[str, List[Any]] = {}
        errors = []
        for name in names:
            per_rank = {}
            for r in range(world_size):  # every rank's record, so a failing rank's error is reported
                path = os.path.join(out_dir, f"{name}.rank{r}.pkl")
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        status, value = pickle.load(f)
                    if status == "error":
                        errors.append(value)
                    per_rank[r] = value
            if errors or len(per_rank) < world_size:
                break
            results[name] = [per_rank[r] for r in range(world_size)]
        if errors or len(results) != len(names):
            codes = {r: p.exitcode for r, p in enumerate(procs)}
            raise RuntimeError("\n".join(errors) or f"a worker process failed (exit codes {codes})")
        return results


@dataclass
class Outcome:
    """What a group of processes did: the first non-zero exit code (or 0), their output, their results."""
    returncode: int
    stdout: str
    stderr: str
    results: Optional[List[Any]]


def run_captured(fn: Callable, world_size: int, *args: Any, env: Optional[dict] = None,
                 timeout: float = PROCESS_TIMEOUT_S, compat: bool = True) -> Outcome:
    """fn(rank, *args) in warm processes like run_distributed, but a failure is an outcome, not an error:
    the exit code and the ranks' output (an exception's traceback included) for the test to check."""
    ctx = warm_context()
    with tempfile.TemporaryDirectory() as out_dir:
        port = free_port()
        procs = [ctx.Process(target=_case_worker, args=(r, [Call("call", fn, args)], world_size, port, out_dir,
                                                        process_env(env), True, True, compat))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        _join(procs, timeout)
        codes = [p.exitcode for p in procs]
        results = []
        for r in range(world_size):
            path = os.path.join(out_dir, f"call.rank{r}.pkl")
            status, value = pickle.load(open(path, "rb")) if os.path.exists(path) else ("error", None)
            results.append(value if status == "ok" else None)
        read = {name: Path(out_dir, name).read_text() if Path(out_dir, name).exists() else ""
                for name in ("stdout", "stderr")}
        bad = [c for c in codes if c != 0]
        return Outcome(bad[0] if bad else 0, read["stdout"], read["stderr"], None if bad else results)


def run_distributed(fn: Callable, world_size: int, *args: Any, env: Optional[dict] = None,
                    compat: bool = True) -> List[Any]:
    """fn(rank, *args) on `world_size` warm processes; returns the per-rank results or raises the first error."""
    return run_cases([Call("call", fn, args)], world_size, env=env, compat=compat)["call"]


def run_processes(fn: Callable, world_size: int, *args: Any) -> List[Any]:
    """fn(rank, *args) in `world_size` processes with the default gloo group initialized and no
    RANK/WORLD_SIZE/LOCAL_* variables (the data layer must not need them)."""
    return run_cases([Call("call", fn, args)], world_size, init_group=False)["call"]


# ------------------------------------------------------------------------------------------ pretraining
MODES = ("warm", "python", "torchrun", "launcher")


def pretrain_args(overrides: Sequence[str], config: Optional[Path] = None) -> List[str]:
    """pretrain_cplm.py's arguments: the recipe (configs/tiny.yaml unless given), then the overrides."""
    return ["--config", str(config or TINY_RECIPE), "--set", *overrides]


def pretrain_command(nproc: int, overrides: Sequence[str], mode: str = "python",
                     config: Optional[Path] = None, script: Optional[Sequence[str]] = None) -> List[str]:
    """The command line a user types: `python pretrain_cplm.py` (one process), torchrun, or the launcher.
    `script`: another trainer script and its leading arguments (tests/training/faults.py)."""
    base = [*(script or [str(PRETRAIN)]), *pretrain_args(overrides, config)]
    if mode == "python":
        assert nproc == 1, "python runs one process; use torchrun or launcher"
        return [sys.executable, *base]
    runner = [str(LAUNCHER)] if mode == "launcher" else ["-m", "torch.distributed.run"]
    return [sys.executable, *runner, "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), *base]


def start_pretrain(nproc: int, overrides: Sequence[str], log: Path, mode: str = "warm",
                   extra_env: Optional[Dict[str, str]] = None, config: Optional[Path] = None,
                   script: Optional[Sequence[str]] = None):
    """Start a run in its own process group(s), output (stdout and stderr) to `log`."""
    assert mode in MODES, mode
    if mode != "warm":
        f = open(log, "w")
        return subprocess.Popen(pretrain_command(nproc, overrides, mode, config, script), cwd=REPO,
                                env=process_env(extra_env), stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    return _start_warm(nproc, overrides, Path(log), Path(log), extra_env, config, script)


def _start_warm(nproc: int, overrides: Sequence[str], out: Path, err: Path, extra_env: Optional[Dict[str, str]],
                config: Optional[Path], script: Optional[Sequence[str]] = None) -> WarmJob:
    """`nproc` warm ranks with torchrun's variables (a test's own RANK/WORLD_SIZE/... in extra_env win)."""
    path, *leading = script or [str(PRETRAIN)]
    return start_script(path, [*leading, *pretrain_args(overrides, config)], nproc, out, err, env=process_env(),
                        extra_env=extra_env, cwd=REPO, launcher_vars=True)


def run_pretrain(nproc: int, overrides: Sequence[str], mode: str = "warm", timeout: int = PROCESS_TIMEOUT_S,
                 extra_env: Optional[Dict[str, str]] = None, config: Optional[Path] = None,
                 script: Optional[Sequence[str]] = None) -> subprocess.CompletedProcess:
    """Run to completion; stdout and stderr apart; whatever is left of the run's processes is killed after
    (an orphaned helper, e.g. the async-checkpoint writer after a simulated crash, must not live on)."""
    assert mode in MODES, mode
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        if mode == "warm":
            proc = _start_warm(nproc, overrides, out, err, extra_env, config, script)
        else:
            with open(out, "w") as o, open(err, "w") as e:
                proc = subprocess.Popen(pretrain_command(nproc, overrides, mode, config, script), cwd=REPO,
                                        env=process_env(extra_env), stdout=o, stderr=e, text=True,
                                        start_new_session=True)
        args = proc.args
        try:
            proc.wait(timeout=timeout)
        finally:
            kill_group(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out.read_text(), err.read_text())


def kill_group(proc, sig: int = signal.SIGKILL) -> None:
    """Signal the run's whole process group(s) (no error if they are gone)."""
    if isinstance(proc, WarmJob):
        proc.send_signal(sig)
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def worker_pids(proc) -> List[int]:
    """The training processes of a run: its warm ranks, the process itself (python), or torchrun's children."""
    if isinstance(proc, WarmJob):
        return [p.pid for p in proc.procs]
    import psutil

    children = psutil.Process(proc.pid).children(recursive=True)
    return [c.pid for c in children] if children else [proc.pid]


# ---------------------------------------------------------------------------------------------- tools
def tool_command(name: str, *args: str) -> List[str]:
    """`python tools/<name>.py ARGS`."""
    return [sys.executable, str(REPO / "tools" / f"{name}.py"), *args]


def run_tool(name: str, *args: str, env: Optional[Dict[str, str]] = None, timeout: int = PROCESS_TIMEOUT_S,
             cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """A tool as a user runs it, to completion (exit code and both streams)."""
    return subprocess.run(tool_command(name, *args), cwd=cwd or REPO, env=process_env(env), capture_output=True,
                          text=True, timeout=timeout)


def _tool_main(rank: int, name: str, args: Tuple[str, ...]) -> None:
    """In a warm process: tools/<name>.py's main(args), its return value (or SystemExit) as the exit code."""
    from tests.data_fixtures import load_tool

    try:
        code = load_tool(name).main(list(args))
    except SystemExit as e:  # argparse errors, SystemExit("message")
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def run_tool_warm(name: str, *args: str, env: Optional[Dict[str, str]] = None,
                  timeout: int = PROCESS_TIMEOUT_S) -> subprocess.CompletedProcess:
    """A tool's main(ARGS) in a warm process (no interpreter start; its megatron state dies with it): for the
    tests of what a tool computes and refuses, where the interpreter boundary is not what is tested."""
    out = run_captured(_tool_main, 1, name, tuple(args), env=env, timeout=timeout)
    return subprocess.CompletedProcess(["tools/" + name + ".py", *args], out.returncode, out.stdout, out.stderr)


def start_tool(name: str, *args: str, env: Optional[Dict[str, str]] = None,
               cwd: Optional[Path] = None) -> subprocess.Popen:
    """A tool as a user runs it, in the background (stdout and stderr together, as text)."""
    return subprocess.Popen(tool_command(name, *args), cwd=cwd or REPO, env=process_env(env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
