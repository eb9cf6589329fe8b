"""While an experiment's jobs run: which run of how many, the overall ETA (RunProgress) and each running job's latest
progress line (LogWatcher)."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.launch.launcher import JobResult
from cplm_megatron.experiments.run import Run

PROGRESS_FIELDS = ("iter ", "loss ", "ETA ")  # of a trainer's console line, what a progress line keeps


class RunProgress:
    """Where an invocation is among its runs: "run k of N" and the overall ETA. A run left costs its training steps at
    the seconds per step, and its evaluated checkpoints at the seconds per checkpoint, of the runs of its experiment
    finished in this invocation (of every experiment while none of its own is; reused runs took no time and count
    for nothing); a running one less the steps it logged; `jobs` runs at a time."""

    def __init__(self, runs: list[Run], jobs: int = 1):
        self.names = [r.name for r in runs]
        self.kind = {r.name: r.experiment or r.group for r in runs}
        self.steps, self.evals = {}, {}
        for r in runs:
            settings = dict(r.settings)
            self.steps[r.name] = int(settings.get("train.iters", 1))
            interval = int(settings.get("checkpoint.interval") or self.steps[r.name])
            self.evals[r.name] = self.steps[r.name] // interval + 1 if r.evaluation.every_checkpoint else 1
        self.jobs = max(1, jobs)
        self.ran: dict[str, bool] = {}  # finished runs: trained now (False: reused or failed)
        self.seconds: dict[str, tuple[float, float]] = {}  # the runs trained now: (training, evaluation) seconds

    def position(self, name: str) -> str:
        return f"run {self.names.index(name) + 1} of {len(self.names)}"

    def finish(self, result: JobResult) -> None:
        """A run's job ended."""
        name = result.spec.name
        self.ran[name] = not (result.reused or result.error)
        if self.ran[name]:
            self.seconds[name] = (result.train_seconds, result.eval_seconds)

    def _rates(self, seconds: dict[str, tuple[float, float]], kind: str) -> tuple[float, float]:
        """(seconds per training step, seconds per evaluated checkpoint) of the finished runs of `kind` (or all)."""
        names = [n for n in seconds if self.kind[n] == kind] or list(seconds)
        return (sum(seconds[n][0] for n in names) / sum(self.steps[n] for n in names),
                sum(seconds[n][1] for n in names) / sum(self.evals[n] for n in names))

    def eta(self, running_steps: dict[str, int] | None = None) -> float | None:
        """Seconds left (None before a run finished in this invocation); `running_steps`: the steps the running
        runs logged."""
        seconds, finished = dict(self.seconds), set(self.ran)  # copies: the LogWatcher's thread reads them too
        if not seconds:
            return None
        left = 0.0
        for name in (n for n in self.names if n not in finished):
            per_step, per_eval = self._rates(seconds, self.kind[name])
            left += max(0, self.steps[name] - (running_steps or {}).get(name, 0)) * per_step
            left += self.evals[name] * per_eval
        return left / self.jobs

    def note(self, running_steps: dict[str, int] | None = None) -> str:
        """'; overall ETA H:MM:SS', or '' before it is known."""
        import datetime

        eta = self.eta(running_steps)
        return "" if eta is None else f"; overall ETA {datetime.timedelta(seconds=round(eta))}"


class LogWatcher:
    """While jobs run: every `every` seconds, each run's latest training progress (step, loss, ETA) and the log it
    comes from, once per change; logs written before the watcher started (reused runs) are left out. With a
    RunProgress: each line says which run of how many, and the overall ETA."""

    def __init__(self, runs_dir: Path, every: float, say: Callable[[str], None] = print,
                 progress: RunProgress | None = None):
        import threading

        self.runs_dir, self.every, self.say, self.progress = Path(runs_dir), every, say, progress
        self.started = time.time()
        self.shown: dict[Any, Any] = {}  # per run dir: the status shown; per ('log', run dir): the log named
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> LogWatcher:
        if self.every > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            for line in self.poll():
                self.say(line)

    def poll(self) -> list[str]:
        """The progress lines to print now: per run, its evaluation once that started, else its training."""
        changed, running = [], {}
        for run_dir in sorted(p for p in self.runs_dir.glob("*") if p.is_dir()):
            log = next((run_dir / name for name in ("eval.log", "train.log") if self._fresh(run_dir / name)), None)
            if log is None:
                continue
            status = self._status(log)
            if self.progress is not None and run_dir.name in self.progress.steps and \
                    run_dir.name not in self.progress.ran:  # the steps a running job has trained
                step = re.match(r"training: iter (\d+)/", status)
                running[run_dir.name] = self.progress.steps[run_dir.name] if log.name == "eval.log" else \
                    int(step.group(1)) if step else 0
            if status and self.shown.get(run_dir) != status:
                named = self.shown.get(("log", run_dir)) == log
                self.shown[run_dir], self.shown[("log", run_dir)] = status, log
                changed.append((run_dir.name, status, "" if named else f" (log {log})"))
        if self.progress is None:
            return [f"[ablate] {name}: {status}{log}" for name, status, log in changed]
        note = self.progress.note(running)
        return [f"[ablate] {self.progress.position(name)}, {name}: {status}{note}{log}" for name, status, log in changed
                if name in self.progress.names]

    def _fresh(self, log: Path) -> bool:
        try:
            return log.stat().st_mtime >= self.started
        except OSError:
            return False

    @staticmethod
    def _status(log: Path) -> str:
        if log.name == "eval.log":
            return "evaluating the checkpoints"
        try:
            text = log.read_text(errors="replace")
        except OSError:
            return ""
        steps = [line for line in text.splitlines() if line.startswith("iter ")]
        if not steps:
            return "training: starting"
        return "training: " + " | ".join(part for part in steps[-1].split(" | ") if part.startswith(PROGRESS_FIELDS))
