"""One launcher for every experiment: a run is trained by `python -m cplm_megatron.pretrain`, then evaluated by
`python -m cplm_megatron.evaluate`, through a backend -- warm processes forked from a preloaded forkserver
(warm.py; the default), a fresh interpreter (torchrun with `processes` > 1), or SLURM (sbatch; see
`slurm_commands`). Nothing points into a checkout: an installed wheel runs a study.

A run dir records its run in job.json (records.py): a finished run with the same record is reused, an unfinished
one resumes (the trainer continues from its latest checkpoint), a different one is refused. Logs go to
`<output>/runs/<name>/{train,eval}.log`, the evaluation to `eval.json`, the seconds of every attempt to timing.json.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cplm_megatron.durable_files import write_atomic
from cplm_megatron.experiments.records import (
    JOB_RECORD,
    TIMING,
    JobRecord,
    RecordError,
    read_job_record,
    read_timing,
    write_job_record,
)
from cplm_megatron.experiments.run import Run
from cplm_megatron.training.signals import RESUME_EXIT_CODE, WATCH_LAUNCHER_ENV

PRETRAIN = "cplm_megatron.pretrain"
EVALUATE = "cplm_megatron.evaluate"
BACKENDS = ("warm", "subprocess")


@dataclass(frozen=True)
class Command:
    """A module run as `python -m MODULE ARGV` in `processes` processes (torchrun's environment when > 1)."""

    module: str
    argv: tuple[str, ...]
    processes: int = 1

    def argv_list(self, python: str | None = None) -> list[str]:
        """The command line of a fresh interpreter (torchrun when processes > 1): `python`, or this interpreter
        with its flags (e.g. -S), as multiprocessing starts its helpers."""
        head = [python] if python else [sys.executable, *subprocess._args_from_interpreter_flags()]
        if self.processes > 1:
            return [*head, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.processes}",
                    "-m", self.module, *self.argv]
        return [*head, "-m", self.module, *self.argv]


def train_command(run: Run, run_dir: Path, processes: int = 1) -> Command:
    """The trainer's command of a run (tensor parallel over `processes` processes when > 1)."""
    sets = [f"run.dir={run_dir}", *run.overrides(), *([f"parallel.tp={processes}"] if processes > 1 else [])]
    return Command(PRETRAIN, ("--config", run.recipe, "--set", *sets), processes)


def eval_command(run: Run, run_dir: Path) -> Command:
    """The evaluator's command of a run: its options, the run dir's checkpoints, eval.json beside them."""
    return Command(EVALUATE, ("--checkpoint", str(run_dir), "--no-progress", "--output", str(run_dir / "eval.json"),
                              *run.evaluation.args()))


def slurm_commands(run: Run, run_dir: Path, logs: Path, sbatch_args: Sequence[str] = (),
                   eval_sbatch_args: Sequence[str] = (), train_script: str | None = None, python: str = sys.executable,
                   train_job: str = "TRAIN_JOB_ID") -> tuple[list[str], list[str]]:
    """The SLURM backend: the sbatch lines of a run's training and of its evaluation, which starts after the
    training job `train_job` succeeded. Training runs `train_script` (e.g. a checkout's slurm/pretrain_<size>.sh,
    which holds the run's recipe, its #SBATCH directives and the requeue-on-preemption loop) with the run's
    `--set` arguments, or else `srun python -m cplm_megatron.pretrain`."""
    train = train_command(run, run_dir)
    head = ["sbatch", "--parsable", f"--output={logs}/%x-%j.out"]
    if train_script is not None:
        train_line = [*head[:2], f"--job-name=study-{run.name}", *head[2:], *sbatch_args, train_script,
                      *train.argv[2:]]
    else:
        train_line = [*head[:2], f"--job-name=study-{run.name}", *head[2:], *sbatch_args,
                      f"--wrap=srun {shlex.join(train.argv_list(python))}"]
    ev = eval_command(run, run_dir)
    eval_line = [*head[:2], f"--job-name=study-eval-{run.name}", *head[2:], f"--dependency=afterok:{train_job}",
                 "--nodes=1", "--ntasks=1", *sbatch_args, *eval_sbatch_args, f"--wrap={shlex.join(ev.argv_list(python))}"]
    return train_line, eval_line


def sbatch(cmd: Sequence[str], cwd: Path, error: type[Exception] = ValueError) -> str:
    """Submit an `sbatch --parsable` line from `cwd` (where the scripts find slurm/launch.sh); the job id, or `error`
    with sbatch's message and the command."""
    result = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise error(f"sbatch failed ({result.returncode}): {result.stderr.strip()}\n  command: {shlex.join(cmd)}")
    return result.stdout.strip().split(";")[0]


def recipe_of(script: Path, error: type[Exception] = ValueError) -> str:
    """The shipped recipe a pretrain_<size>.sh script trains (its `recipe=configs/NAME.yaml` line): NAME; `error`
    when the script has no such line."""
    found = re.search(r"^recipe=(\S+)", Path(script).read_text(), re.MULTILINE)
    if not found:
        raise error(f"{script} has no 'recipe=' line")
    return Path(found.group(1).strip("\"'")).stem


def subprocess_env(threads: int) -> dict[str, str]:
    """Each job's environment: `threads` intra-op threads (tiny models run fastest single-threaded); a trainer whose
    launcher dies (the runner killed, its forkserver with it) stops as on SIGTERM instead of training on alone."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONWARNINGS": "ignore",
            WATCH_LAUNCHER_ENV: "1"}


def run_command(command: Command, log: Path, env: dict[str, str], backend: str = "warm",
                started: Callable[[object], None] | None = None) -> int:
    """Run `command` with its output in `log` through `backend` ("warm": processes forked from the forkserver, or
    a fresh interpreter when the project's code changed since it preloaded it; "subprocess": a fresh one).
    `started(handle)`: called with the running job (it has `send_signal`) once it runs."""
    from cplm_megatron.experiments.launch.warm import source_changed, start_module

    if backend not in BACKENDS:
        raise ValueError(f"unknown launcher backend {backend!r}; choose from {', '.join(BACKENDS)} (or SLURM: "
                         "slurm_commands)")
    with open(log, "w") as f:
        f.write("$ " + shlex.join(command.argv_list()) + "\n")
        if backend == "warm" and source_changed():  # the warm processes would run the code as it was at start
            f.write("[jobs] the project's code changed since this tool started: a fresh interpreter for this job\n")
            backend = "subprocess"
        f.flush()
        if backend == "subprocess":
            job = subprocess.Popen(command.argv_list(), stdout=f, stderr=subprocess.STDOUT, env=env)
        else:
            job = start_module(command.module, list(command.argv), command.processes, log, env=env,
                               new_session=False)
    if started is not None:
        started(job)
    return job.wait()


@dataclass
class JobResult:
    """What one run's job did."""

    spec: Run
    run_dir: Path
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    error: str | None = None
    reused: bool = False  # finished earlier with the same record: nothing ran now
    progress: tuple[str, str] = ("", "")  # where a pipeline tracks it: ("run k of N", "; overall ETA H:MM:SS")

    def status_line(self) -> str:
        """'NAME: done (train S s, eval S s)', 'NAME: reused' or 'NAME: FAILED (...)' for progress output (with
        `progress`: 'run k of N, NAME: ...; overall ETA ...')."""
        where, eta = self.progress
        name = f"{where}, {self.spec.name}" if where else self.spec.name
        if self.error:
            return f"{name}: FAILED ({self.error})"
        if self.reused:
            return f"{name}: reused (finished earlier with the same commands){eta}"
        return f"{name}: done (train {self.train_seconds:.0f} s, eval {self.eval_seconds:.0f} s){eta}"


def _tail(log: Path, lines: int = 8) -> str:
    """The last lines of a failed job's log, indented, so the failure's cause shows where it is reported."""
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    return "".join(f"\n    | {line}" for line in text)


def _evaluated(run_dir: Path) -> bool:
    """Whether a run dir holds a finished job's outputs (the trainer's run record and the evaluation)."""
    from cplm_megatron.training.run_record import has_run_record

    return (run_dir / "eval.json").is_file() and has_run_record(run_dir)


class _JobClock:
    """Writes the job's cumulative seconds to timing.json every `interval` s while a command runs, so a
    job resumed after a kill still records the time of every attempt (not only the last one's)."""

    def __init__(self, run_dir: Path, key: str, interval: float = 30.0):
        self.path, self.key, self.interval = run_dir / TIMING, key, interval
        self.record = {"train_seconds": 0.0, "eval_seconds": 0.0, **(read_timing(self.path) or {})}
        self.record["attempts"] = int(self.record.get("attempts", 0)) + (key == "train_seconds")
        self.before = float(self.record[key])
        self.start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.write(complete=False)

    def seconds(self) -> float:
        """This attempt's seconds so far."""
        return time.perf_counter() - self.start

    def write(self, complete: bool, seconds: float | None = None) -> None:
        self.record[self.key] = self.before + (self.seconds() if seconds is None else seconds)
        self.record["complete"] = complete
        try:
            write_atomic(self.path, json.dumps(self.record) + "\n")
        except OSError:  # a full disk: the previous record stays whole; the next tick or the stop writes again
            pass

    def stop(self, complete: bool = False) -> float:
        """Stop ticking, write the record; returns this attempt's seconds."""
        self._stop.set()
        self._thread.join()
        seconds = self.seconds()
        self.write(complete, seconds)
        return seconds


# What stops a runner (its queue cancelled, its running jobs asked to checkpoint): Ctrl-C, a SIGTERM (scancel, a
# supervisor) or SIGHUP (the terminal or ssh session closed; left ignored under nohup)
RUNNER_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stop_signals_interrupt(on_signal: Callable[[int], None] = lambda signum: None):
    """While the block runs in the main thread: RUNNER_STOP_SIGNALS call `on_signal(signum)`, then raise
    KeyboardInterrupt, whatever the process inherited. A runner started in the background of a script inherits
    SIGINT ignored: it ran its whole queue through a Ctrl-C its jobs obeyed. SIGHUP stays ignored when it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:  # noqa: ARG001 - signal handler signature
        on_signal(signum)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in RUNNER_STOP_SIGNALS
                if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_as_runner(body: Callable[[], int], prefix: str) -> int:
    """`body()`'s exit code as a runner's command line ends: failed jobs one `error:` line and 1; a stop signal one line
    and 75 (every stopped run checkpointed) or 130, whatever signal handling the process inherited."""
    import sys

    try:
        with stop_signals_interrupt():
            return body()
    except RuntimeError as err:  # failed jobs: their logs' last lines
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RunsInterrupted as stop:  # Ctrl-C: queued jobs cancelled, running ones checkpointed (75) or not (130)
        print(stop, file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # outside the jobs (building corpora, writing the report): nothing of a run lost
        print(f"[{prefix}] interrupted; relaunch the same command to continue (finished runs are reused)",
              file=sys.stderr)
        return 130


class RunsInterrupted(Exception):
    """Ctrl-C (SIGINT) stopped `run_all`: queued jobs cancelled, running ones stopped (their trainers checkpoint);
    the message is the one line to print, `exit_code` 75 (every stopped run can resume) or 130."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Launcher:
    """Where and how runs are launched: under `output`, with data paths under `data_root` recorded relative to it,
    `processes` processes per training run (tensor parallel), `threads` torch threads per process, `backend`."""

    output: Path
    data_root: Path | None = None
    processes: int = 1
    threads: int = 1
    backend: str = "warm"
    _stopping: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    _running: dict = field(default_factory=dict, compare=False, repr=False)  # run name -> its running job
    _signals: list = field(default_factory=list, compare=False, repr=False)  # the stop signals received

    def run_dir(self, run: Run) -> Path:
        return Path(self.output).resolve() / "runs" / run.name

    def record(self, run: Run) -> JobRecord:
        return JobRecord.of(run, self.processes, self.output, self.data_root)

    def recorded_matches(self, run: Run) -> bool:
        """Whether the run dir's job record (any version) is this run's, as launched here."""
        recorded = read_job_record(self.run_dir(run) / JOB_RECORD)
        return recorded.expanded(self.output, self.data_root) == self.record(run).expanded(self.output, self.data_root)

    def is_finished(self, run: Run) -> bool:
        """Whether `run` finished (evaluated) under `output` with the record it gets now."""
        run_dir = self.run_dir(run)
        return _evaluated(run_dir) and (run_dir / JOB_RECORD).is_file() and self.recorded_matches(run)

    def run_job(self, run: Run) -> JobResult:
        """Train `run`, then evaluate its checkpoints (reused when finished with the same record)."""
        run_dir = self.run_dir(run)
        result = JobResult(run, run_dir)
        record_path = run_dir / JOB_RECORD
        if record_path.is_file():
            try:
                same = self.recorded_matches(run)
            except RecordError as e:
                result.error = str(e)
                return result
            if not same:
                result.error = (f"{run_dir} holds a run made with other settings (see {record_path}); remove it or "
                                f"choose another --output")
                return result
            if _evaluated(run_dir):
                result.reused = True
                return result
        elif run_dir.is_dir() and any(run_dir.iterdir()):
            result.error = (f"{run_dir} exists but was not made by this tool (no job.json); remove it or choose "
                            f"another --output")
            return result
        else:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_job_record(record_path, self.record(run))
        env = subprocess_env(self.threads)
        try:
            clock = _JobClock(run_dir, "train_seconds")
        except RecordError as e:
            result.error = str(e)
            return result
        code = self._run(run, train_command(run, run_dir, self.processes), run_dir / "train.log", env)
        result.train_seconds = clock.stop()
        if code != 0:
            result.error = f"training failed (exit {code}); see {run_dir / 'train.log'}{_tail(run_dir / 'train.log')}"
            return result
        clock = _JobClock(run_dir, "eval_seconds")
        code = self._run(run, eval_command(run, run_dir), run_dir / "eval.log", env)
        result.eval_seconds = clock.stop(complete=code == 0)
        if code != 0:
            result.error = f"evaluation failed (exit {code}); see {run_dir / 'eval.log'}{_tail(run_dir / 'eval.log')}"
        return result

    def _run(self, run: Run, command: Command, log: Path, env: dict[str, str]) -> int:
        """One command of a job, known as running (for a Ctrl-C to reach it) while it runs; not started once the
        launcher is stopping (RESUME_EXIT_CODE: nothing lost)."""
        if self._stopping.is_set():
            return RESUME_EXIT_CODE
        try:
            return run_command(command, log, env, self.backend, started=lambda job: self._started(run, job))
        finally:
            self._running.pop(run.name, None)

    def _started(self, run: Run, job: object) -> None:
        self._running[run.name] = job
        if self._stopping.is_set():  # the stop came while it started
            job.send_signal(signal.SIGINT)

    def run_all(self, runs: Sequence[Run], jobs: int = 2,
                on_done: Callable[[JobResult], None] | None = None) -> list[JobResult]:
        """Run every job, `jobs` at a time; RuntimeError naming the failed ones' logs; RunsInterrupted on Ctrl-C."""
        Path(self.output).mkdir(parents=True, exist_ok=True)
        self._stopping.clear()  # a launcher interrupted before runs again
        self._signals.clear()
        results: list[JobResult] = []
        with stop_signals_interrupt(self._stop_requested):
            pool = ThreadPoolExecutor(max_workers=max(1, jobs))
            futures = [pool.submit(self.run_job, run) for run in runs]
            try:
                for future in futures:
                    result = future.result()
                    results.append(result)
                    if on_done is not None:
                        on_done(result)
                pool.shutdown()
            except KeyboardInterrupt:
                raise self._interrupted(pool, futures) from None
        failed = [r.error for r in results if r.error]
        if failed:
            raise RuntimeError("jobs failed:\n  " + "\n  ".join(failed))
        return results

    def _stop_requested(self, signum: int) -> None:
        """A stop signal (in the main thread, before its KeyboardInterrupt): no job starts from now on."""
        self._signals.append(signum)
        self._stopping.set()

    def _interrupted(self, pool: ThreadPoolExecutor, futures: list) -> RunsInterrupted:
        """After a Ctrl-C (or another stop signal): cancel the queued jobs, ask the running ones to stop (their
        trainers checkpoint at the next step; a terminal's Ctrl-C reached them already, a repeat within a second
        counts once) and wait for them (a second signal stops waiting); the one line to print and the exit code."""
        self._stopping.set()
        cancelled = sum(f.cancel() for f in futures)
        stopping = list(self._running.items())
        for _, job in stopping:
            try:
                job.send_signal(signal.SIGINT)
            except (ProcessLookupError, OSError):
                pass
        how = f"interrupted{_by(self._signals[:1])}"
        try:
            pool.shutdown(wait=True)
        except KeyboardInterrupt:
            return RunsInterrupted(f"[jobs] interrupted twice: {cancelled} queued job(s) cancelled, "
                                   f"{', '.join(name for name, _ in stopping) or 'no job'} stopped without waiting "
                                   f"for a checkpoint; relaunch the same command to continue", 130)
        codes = {name: job.returncode if hasattr(job, "returncode") else None for name, job in stopping}
        clean = all(code in (0, RESUME_EXIT_CODE) for code in codes.values())
        names = ", ".join(codes) or "none was running"
        return RunsInterrupted(
            f"[jobs] {how}: {cancelled} queued job(s) cancelled; running: {names}"
            f"{' (stopped with a checkpoint)' if clean and codes else ''}; relaunch the same command to continue "
            f"(finished runs are reused, stopped ones resume)", RESUME_EXIT_CODE if clean else 130)


def _by(signals: list) -> str:
    """' by SIGTERM' for a stop signal other than Ctrl-C; '' for Ctrl-C (or none recorded)."""
    return f" by {signal.Signals(signals[0]).name}" if signals and signals[0] != signal.SIGINT else ""
