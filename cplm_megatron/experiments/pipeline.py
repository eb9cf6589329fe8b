"""The whole ablation (or the recipe study) in one call: plan, train and evaluate every run, write the report.

    outcome = run_ablation(Path("runs/ablation"), AblationSettings.quick(), data_dir=Path("data/stdlib"))
    outcome.report        # runs/ablation/report.md (+ PNG plots beside it)
    outcome.spamlang      # per SpamLang pair: steps to >= 99% accuracy for CPLM and baseline, ...

    study = run_recipe_study(Path("runs/study"), StudySettings(), Path("data"), SpamLangSettings())
    study.summary["decision"]  # the default the study's rule chose; study.report, study.summary_json
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.ablation.plan import AblationSettings, ablation_runs
from cplm_megatron.experiments.ablation.report import pair_up, spamlang_claims, write_report
from cplm_megatron.experiments.launch.launcher import JobResult, Launcher
from cplm_megatron.experiments.records import RunResults, load_run, run_seconds, write_study_summary_json
from cplm_megatron.experiments.run import Run
from cplm_megatron.experiments.study.plan import ARMS, StudySettings, ensure_corpora, study_runs
from cplm_megatron.experiments.study.report import write_study_report
from cplm_megatron.experiments.study.summary import summarize

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


@dataclass
class AblationOutcome:
    """Where the report is and the headline numbers."""

    report: Path
    results_json: Path
    spamlang: list[dict[str, Any]]
    runs: list[RunResults]
    seconds: float


def run_ablation(output: Path, settings: AblationSettings, data_dir: Path | None = None, tp: int = 1, jobs: int = 2,
                 threads: int = 1, command: str = "", on_done: Callable[[JobResult], None] | None = None,
                 backend: str = "warm", progress_every: float = 0.0) -> AblationOutcome:
    """Train/evaluate every pair of `settings` under `output` (finished runs are reused) and write the report;
    `progress_every` > 0: print the running jobs' progress that often (LogWatcher).

    Raises RuntimeError naming the logs of failed runs; ValueError/FileNotFoundError for bad settings/data.
    """
    output = Path(output).resolve()
    specs = ablation_runs(settings, data_dir)
    start = time.perf_counter()
    launcher = Launcher(output, Path(data_dir).resolve().parent if data_dir is not None else None, tp, threads, backend)
    progress = RunProgress(specs, jobs)

    def done(result: JobResult) -> None:
        progress.finish(result)
        result.progress = (progress.position(result.spec.name), progress.note())
        if on_done is not None:
            on_done(result)

    with LogWatcher(output / "runs", progress_every, lambda line: print(line, flush=True), progress):
        jobs_done = launcher.run_all(specs, jobs=jobs, on_done=done)
    runs = [load_run(spec, output) for spec in specs]
    seconds = time.perf_counter() - start
    meta = {"command": command, "settings": {**dataclasses.asdict(settings), "tp": tp}, "seconds": seconds,
            "runtimes": {r.spec.name: (r.train_seconds, r.eval_seconds) for r in jobs_done}}
    report = write_report(output, runs, meta)
    claims = spamlang_claims(pair_up(runs))
    results_json = output / "results.json"
    results_json.write_text(json.dumps({
        "meta": meta, "spamlang": claims,
        "runs": {r.spec.name: {"label": r.spec.label, "metrics": r.metrics, "evaluations": r.checkpoints}
                 for r in runs},
    }, indent=2) + "\n")
    return AblationOutcome(report, results_json, claims, runs, seconds)


@dataclass
class SpamLangSettings:
    """The recipe study's SpamLang part: baseline vs the chosen default at a large vocabulary, per seed (the
    baseline trains 600 steps: 10x the 60 in which the CPLM is at its ceiling from the start)."""

    vocab: int = 131072  # >= 100k: Godey & Artzi's regime
    hiddens: tuple[int, ...] = (64, 128)
    iters: int = 600
    interval: int = 100
    eval_sequences: int = 32
    seeds: tuple[int, ...] = (1, 2)

    @classmethod
    def smoke(cls) -> SpamLangSettings:
        return cls(vocab=4096, hiddens=(64,), iters=4, interval=2, eval_sequences=4, seeds=(1,))


@dataclass
class StudyOutcome:
    """Where the study's outputs are and what it decided."""

    report: Path
    summary_json: Path
    summary: dict[str, Any]


def run_recipe_study(output: Path, settings: StudySettings, data_root: Path, spamlang: SpamLangSettings | None,
                     jobs: int = 2, threads: int = 1, command: str = "",
                     on_done: Callable[[JobResult], None] | None = None, log: Callable[[str], None] = print,
                     backend: str = "warm") -> StudyOutcome:
    """Train/evaluate every run of the study (finished runs are reused), decide, run SpamLang with the decided
    default, and write OUTPUT/summary.json, OUTPUT/report.md and the plots."""
    output = Path(output).resolve()
    start = time.perf_counter()
    corpora = ensure_corpora(settings, data_root, log=log)
    specs = study_runs(settings, corpora)
    log(f"[study] {len(specs)} runs: arms {', '.join(settings.arms)} x seeds {list(settings.seeds)} x scales "
        f"{', '.join(settings.scales)} (per scale: " + "; ".join(
            f"{sc}: {len(settings.arms_at(sc))} arms x {len(settings.seeds_at(sc))} seeds" for sc in settings.scales)
        + f"); {jobs} at a time")
    Launcher(output, data_root, 1, threads, backend).run_all(specs, jobs=jobs, on_done=on_done)
    return write_study_summary(output, settings, data_root, specs, spamlang, jobs, threads, command, on_done, log,
                               start)


def spamlang_arm(summary: dict[str, Any]) -> str:
    """The CPLM arm SpamLang runs: the decided default, or (no arm credited) the lowest mean val loss at the
    largest scale."""
    if summary["decision"]["default"] != "baseline":
        return summary["decision"]["default"]
    arms = summary["scales"][summary["largest_scale"]]["arms"]
    return min((a for a in arms if a != "baseline"), key=lambda a: arms[a]["mean_std"]["val_loss"]["mean"])


def summarize_study(output: Path, settings: StudySettings, data_root: Path, command: str = "",
                    log: Callable[[str], None] = print) -> StudyOutcome:
    """summary.json, report.md and the plots of the runs of the study that finished so far (nothing is trained;
    a partial grid gives a provisional decision)."""
    output = Path(output).resolve()
    specs = study_runs(settings, ensure_corpora(settings, data_root, log=log))
    return write_study_summary(output, settings, data_root, specs, None, 1, 1, command, None, log,
                               time.perf_counter())


def spamlang_dir(output: Path, hidden: int, seed: int) -> Path:
    """Where the SpamLang pair of one hidden size and seed lives."""
    return output / f"spamlang_h{hidden}_s{seed}"


def recorded_spamlang_claims(output: Path) -> list[dict[str, Any]]:
    """The SpamLang claims an earlier invocation wrote (OUTPUT/spamlang_h<hidden>_s<seed>/results.json, by hidden
    size and seed), so a summary that runs no SpamLang keeps them."""
    def key(path: Path) -> tuple[int, int]:
        hidden, seed = path.parent.name.removeprefix("spamlang_h").split("_s")
        return int(hidden), int(seed)

    paths = sorted(output.glob("spamlang_h*_s*/results.json"), key=key)
    return [claim for path in paths for claim in json.loads(path.read_text())["spamlang"]]


def write_study_summary(output: Path, settings: StudySettings, data_root: Path, specs: list[Run],
                        spamlang: SpamLangSettings | None, jobs: int, threads: int, command: str,
                        on_done: Callable[[JobResult], None] | None, log: Callable[[str], None], start: float
                        ) -> StudyOutcome:
    """Summarize the finished runs of `specs`, run SpamLang with the decided default when asked, write the outputs."""
    launcher = Launcher(output, data_root)
    finished = [spec for spec in specs if launcher.is_finished(spec)]
    log(f"[study] {len(finished)} of {len(specs)} runs finished")
    summary = summarize([load_run(spec, output) for spec in finished], planned=StudySettings().planned())
    claims = [] if spamlang is not None else recorded_spamlang_claims(output)
    if spamlang is not None:
        arm = ARMS[spamlang_arm(summary)]
        for hidden, seed in ((h, s) for h in spamlang.hiddens for s in spamlang.seeds):
            spam = AblationSettings(hidden_size=hidden, experiments=("spamlang",), spamlang_vocabs=(spamlang.vocab,),
                            spamlang_ties=(False,), spamlang_iters=spamlang.iters, spamlang_interval=spamlang.interval,
                            eval_sequences=spamlang.eval_sequences, seed=seed, extra_settings=arm.settings)
            log(f"[study] SpamLang V={spamlang.vocab}, hidden {hidden}, seed {seed}: baseline vs {arm.name}")
            claims += run_ablation(spamlang_dir(output, hidden, seed), spam, None, jobs=jobs, threads=threads,
                                   command=command, on_done=on_done).spamlang
    recorded = [run_seconds(output / "runs" / spec.name) for spec in finished]
    summary.update(command=command, seconds_this_invocation=time.perf_counter() - start,
                   run_seconds_total=sum(t for t in recorded if t is not None),
                   runs_with_timing=sum(t is not None for t in recorded), jobs=jobs,
                   settings=dataclasses.asdict(settings), spamlang=claims)
    summary_json = write_study_summary_json(output / "summary.json", summary)
    report = write_study_report(output, summary, claims)
    return StudyOutcome(report, summary_json, summary)
