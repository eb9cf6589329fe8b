"""Baseline-vs-CPLM ablations: plan the training runs, launch the real trainer, evaluate checkpoints.

Every pair of runs differs only in `copy_head.enabled`: same recipe, seed, data order and steps
(and the same backbone initialization, since the Copy-Paste head is built after the backbone).
A job is one run: `pretrain/pretrain_cplm.py` in a subprocess (torchrun with TP=2 when asked), then
`tools/evaluate.py --all-checkpoints --include-initial` on its checkpoints. Logs go to
`<output>/runs/<name>/{train,eval}.log`; the evaluation to `<output>/runs/<name>/eval.json`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.data.manifest import read_manifest

REPO_ROOT = Path(__file__).resolve().parents[2]
PRETRAIN = REPO_ROOT / "pretrain" / "pretrain_cplm.py"
EVALUATE = REPO_ROOT / "tools" / "evaluate.py"
RECIPE = REPO_ROOT / "configs" / "tiny.yaml"
TIMING = "timing.json"  # a job's training and evaluation seconds, every attempt counted


@dataclass(frozen=True)
class RunSpec:
    """One training run of an ablation pair and how to evaluate it."""

    name: str  # directory name under <output>/runs
    group: str  # the pair: runs of a group differ only in the copy head
    experiment: str  # "corpus" | "spamlang"
    copy_head: bool
    overrides: tuple[str, ...]  # --set KEY=VALUE for the trainer (besides run.dir, copy_head.enabled)
    eval_args: tuple[str, ...]  # tools/evaluate.py arguments (tasks and their sizes)
    labels: tuple[tuple[str, Any], ...] = ()  # facts for the report: (("vocab", 4096), ...)
    every_checkpoint: bool = True  # evaluate every checkpoint and the untrained model (False: the last one)

    @property
    def label(self) -> dict[str, Any]:
        return dict(self.labels)


@dataclass
class Settings:
    """Sizes of the ablation; `quick()` is the CI/demo variant, `full()` the longer one."""

    hidden_size: int = 64
    spamlang_vocabs: tuple[int, ...] = (4096, 8192, 16384)
    spamlang_ties: tuple[bool, ...] = (False, True)  # tie_embeddings variants (untied: Godey & Artzi's setting)
    spamlang_iters: int = 60
    spamlang_interval: int = 5  # checkpoint (and evaluation) interval
    spamlang_seq_len: int = 128
    corpus_iters: int = 600
    corpus_interval: int = 100
    eval_sequences: int = 32  # sequences per task and checkpoint (passkey: per cell)
    experiments: tuple[str, ...] = ("corpus", "spamlang")
    seed: int = 1234  # run.seed and data.seed of every run (the recipes' default)
    extra_overrides: tuple[str, ...] = ()  # trainer --set KEY=VALUE for every run (e.g. copy_head.lm_loss_weight=1)

    @classmethod
    def quick(cls) -> Settings:
        return cls(spamlang_ties=(False,), spamlang_iters=20, spamlang_interval=5, corpus_iters=60,
                   corpus_interval=20, eval_sequences=16)

    @classmethod
    def full(cls) -> Settings:
        return cls()


def _pair(group: str, experiment: str, overrides: Sequence[str], eval_args: Sequence[str],
          labels: dict[str, Any], extra: Sequence[str] = ()) -> list[RunSpec]:
    return [RunSpec(f"{group}-{'cplm' if cplm else 'baseline'}", group, experiment, cplm, (*overrides, *extra),
                    tuple(eval_args), tuple(sorted({**labels, "copy_head": cplm}.items())))
            for cplm in (False, True)]


def plan(settings: Settings, data_dir: Path | None) -> list[RunSpec]:
    """The runs of an ablation, in launch order (longest first)."""
    s = settings
    runs: list[RunSpec] = []
    common = ["logging.wandb=false", f"model.hidden_size={s.hidden_size}", "checkpoint.keep=1000",
              "train.log_interval=5", f"run.seed={s.seed}", f"data.seed={s.seed}"]
    n = str(s.eval_sequences)
    if "corpus" in s.experiments:
        if data_dir is None:
            raise ValueError("the corpus experiment needs the embedded corpus: pass --data DIR (make data)")
        data_dir = Path(data_dir).resolve()
        for split in ("train", "val"):
            if not (data_dir / split / "manifest.json").is_file():
                raise FileNotFoundError(f"{data_dir / split} is not a prepared dataset; build it with "
                                        f"`make data` (tools/build_stdlib_corpus.py --output {data_dir})")
        manifest = read_manifest(str(data_dir / "train"))  # the model takes the corpus' vocabulary and length
        vocab, seq_len = manifest.tokenizer.vocab_size, manifest.seq_len
        overrides = common + [
            f"model.vocab_size={vocab}", f"data.streams=[{data_dir / 'train'}]", f"data.val_streams=[{data_dir / 'val'}]",
            f"train.iters={s.corpus_iters}", f"train.seq_len={seq_len}", "train.micro_batch=4",
            "train.global_batch=8", f"train.eval_interval={s.corpus_interval}", "train.eval_iters=4",
            f"checkpoint.interval={s.corpus_interval}"]
        eval_args = ["--tasks", "val,copy,passkey,gradient", "--limit", n, "--gradient-source", "val",
                     "--copy-length", str(min(128, seq_len)),
                     "--passkey-lengths", ",".join(str(length) for length in sorted({64, seq_len // 2, seq_len})),
                     "--passkey-depths", "0,0.5,1"]
        runs += _pair("corpus", "corpus", overrides, eval_args,
                      {"vocab": vocab, "hidden": s.hidden_size, "tied": True, "iters": s.corpus_iters},
                      s.extra_overrides)
    if "spamlang" in s.experiments:
        for vocab in sorted(s.spamlang_vocabs, reverse=True):
            for tied in s.spamlang_ties:
                group = f"spamlang-v{vocab}-{'tied' if tied else 'untied'}"
                overrides = common + [
                    "data.synthetic=spamlang", f"model.vocab_size={vocab}", f"model.tie_embeddings={str(tied).lower()}",
                    f"train.iters={s.spamlang_iters}", f"train.seq_len={s.spamlang_seq_len}", "train.micro_batch=8",
                    "train.global_batch=8", "train.eval_interval=0", f"checkpoint.interval={s.spamlang_interval}"]
                eval_args = ["--tasks", "spamlang,gradient", "--limit", n, "--gradient-source", "spamlang",
                             "--spamlang-length", str(s.spamlang_seq_len)]
                runs += _pair(group, "spamlang", overrides, eval_args,
                              {"vocab": vocab, "hidden": s.hidden_size, "tied": tied, "iters": s.spamlang_iters},
                              s.extra_overrides)
    return runs


def train_command(spec: RunSpec, run_dir: Path, tp: int) -> list[str]:
    """The trainer command line of a run (torchrun with 2 processes when tp=2)."""
    sets = [f"run.dir={run_dir}", f"copy_head.enabled={str(spec.copy_head).lower()}", *spec.overrides]
    if tp > 1:
        sets.append(f"parallel.tp={tp}")
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={tp}"]
    else:
        launcher = [sys.executable]
    return [*launcher, str(PRETRAIN), "--config", str(RECIPE), "--set", *sets]


def eval_command(spec: RunSpec, run_dir: Path) -> list[str]:
    """tools/evaluate.py over every checkpoint of the run and the untrained model (or over the last checkpoint)."""
    which = ["--all-checkpoints", "--include-initial"] if spec.every_checkpoint else []
    return [sys.executable, str(EVALUATE), "--checkpoint", str(run_dir), *which,
            "--no-progress", "--output", str(run_dir / "eval.json"), *spec.eval_args]


def subprocess_env(threads: int) -> dict[str, str]:
    """Each job's environment: `threads` intra-op threads (tiny models run fastest single-threaded)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "PYTHONWARNINGS": "ignore"}


@dataclass
class JobResult:
    """What one run's job did."""

    spec: RunSpec
    run_dir: Path
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    error: str | None = None
    reused: bool = False  # finished earlier with the same commands: nothing ran now

    def status_line(self) -> str:
        """'NAME: done (train S s, eval S s)', 'NAME: reused' or 'NAME: FAILED (...)' for progress output."""
        if self.error:
            return f"{self.spec.name}: FAILED ({self.error})"
        if self.reused:
            return f"{self.spec.name}: reused (finished earlier with the same commands)"
        return f"{self.spec.name}: done (train {self.train_seconds:.0f} s, eval {self.eval_seconds:.0f} s)"


def _run_logged(cmd: list[str], log: Path, env: dict[str, str], warm: bool) -> int:
    """Run `cmd` (`python SCRIPT ...` or `python -m torch.distributed.run --nproc_per_node=N SCRIPT ...`) with
    its output in `log`: as warm processes (cplm_megatron/experiments/warm.py: no interpreter start-up, the
    same script as `__main__`), or as the subprocess the command line names (also when the project's code
    changed since the warm processes' server imported it)."""
    from cplm_megatron.experiments.warm import source_changed, start_script

    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        if warm and source_changed():  # the warm processes would run the code as it was when the tool started
            f.write("[jobs] the project's code changed since this tool started: a fresh interpreter for this job\n")
            warm = False
        f.flush()
        if not warm:
            return subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  cwd=REPO_ROOT).returncode

    at = next(i for i, arg in enumerate(cmd) if arg.endswith(".py"))
    nproc = next((int(a.split("=", 1)[1]) for a in cmd[:at] if a.startswith("--nproc_per_node=")), 1)
    return start_script(cmd[at], cmd[at + 1:], nproc, log, env=env, cwd=REPO_ROOT, new_session=False).wait()


def _tail(log: Path, lines: int = 8) -> str:
    """The last lines of a failed job's log, indented, so the failure's cause shows where it is reported."""
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    return "".join(f"\n    | {line}" for line in text)


def portable_commands(commands: dict[str, list[str]], output: Path) -> dict[str, list[str]]:
    """A job's commands with the output directory and the checkout written as `{output}` and `{repo}`, so a
    finished run is reused after the study directory or the checkout moved (another machine, a copy)."""
    def portable(arg: str) -> str:
        return arg.replace(str(output), "{output}").replace(str(REPO_ROOT), "{repo}")

    return {key: [portable(arg) for arg in args] for key, args in commands.items()}


def job_commands(spec: RunSpec, output: Path, tp: int) -> dict[str, list[str]]:
    """What a run's job.json records: its train and eval command lines (without the interpreter), portable."""
    run_dir = output / "runs" / spec.name
    return portable_commands({"train": train_command(spec, run_dir, tp)[1:],
                              "eval": eval_command(spec, run_dir)[1:]}, output)


def _evaluated(run_dir: Path) -> bool:
    """Whether a run dir holds a finished job's outputs (the trainer's record and the evaluation)."""
    return (run_dir / "eval.json").is_file() and (run_dir / "summary.json").is_file()


def read_job_record(record: Path) -> dict[str, Any]:
    """A run dir's job.json; ValueError naming the file and the fix when it is not a job record."""
    try:
        data = json.loads(record.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{record} is not a readable job record ({e}); remove {record.parent} to retrain that run, "
                         f"or restore the file") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("train", "eval")):
        raise ValueError(f"{record} is not a job record (it needs 'train' and 'eval' command lists); remove "
                         f"{record.parent} to retrain that run, or restore the file")
    return data


class _JobClock:
    """Writes the job's cumulative seconds to timing.json every `interval` s while a command runs, so a
    job resumed after a kill still records the time of every attempt (not only the last one's)."""

    def __init__(self, run_dir: Path, key: str, interval: float = 30.0):
        self.path, self.key, self.interval = run_dir / TIMING, key, interval
        record = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.record = {"train_seconds": 0.0, "eval_seconds": 0.0, **record}
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
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record) + "\n")
        tmp.replace(self.path)

    def stop(self, complete: bool = False) -> float:
        """Stop ticking, write the record; returns this attempt's seconds."""
        self._stop.set()
        self._thread.join()
        seconds = self.seconds()
        self.write(complete, seconds)
        return seconds


def run_job(spec: RunSpec, output: Path, tp: int, threads: int, warm: bool = True) -> JobResult:
    """Train one run, then evaluate its checkpoints.

    A run dir records its commands in job.json (paths relative to the output and the checkout): a finished
    run with the same commands is reused, an unfinished one resumes (the trainer continues from its latest
    checkpoint); a run dir made with other settings is an error rather than a silent mix. `warm`: the
    commands run in warm processes. timing.json holds the seconds of every attempt of the job.
    """
    run_dir = output / "runs" / spec.name
    result = JobResult(spec, run_dir)
    commands = job_commands(spec, output, tp)
    record = run_dir / "job.json"
    if record.is_file():
        try:
            recorded = read_job_record(record)
        except ValueError as e:
            result.error = str(e)
            return result
        if recorded != commands:
            result.error = (f"{run_dir} holds a run made with other settings (see {record}); remove it or choose "
                            f"another --output")
            return result
        if _evaluated(run_dir):
            result.reused = True
            return result
    elif run_dir.is_dir() and any(run_dir.iterdir()):
        result.error = f"{run_dir} exists but was not made by this tool (no job.json); remove it or choose another --output"
        return result
    run_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(commands, indent=2) + "\n")
    env = subprocess_env(threads)
    clock = _JobClock(run_dir, "train_seconds")
    code = _run_logged(train_command(spec, run_dir, tp), run_dir / "train.log", env, warm)
    result.train_seconds = clock.stop()
    if code != 0:
        result.error = f"training failed (exit {code}); see {run_dir / 'train.log'}{_tail(run_dir / 'train.log')}"
        return result
    clock = _JobClock(run_dir, "eval_seconds")
    code = _run_logged(eval_command(spec, run_dir), run_dir / "eval.log", env, warm)
    result.eval_seconds = clock.stop(complete=code == 0)
    if code != 0:
        result.error = f"evaluation failed (exit {code}); see {run_dir / 'eval.log'}{_tail(run_dir / 'eval.log')}"
        return result
    return result


def is_finished(spec: RunSpec, output: Path, tp: int = 1) -> bool:
    """Whether `spec`'s run under `output` finished (evaluated) with the commands the spec gives now."""
    run_dir = output / "runs" / spec.name
    return _evaluated(run_dir) and read_job_record(run_dir / "job.json") == job_commands(spec, output, tp)


def run_seconds(run_dir: Path) -> float | None:
    """Training + evaluation seconds of a finished job, every attempt counted (None when it recorded none)."""
    path = Path(run_dir) / TIMING
    if not path.is_file():
        return None
    timing = json.loads(path.read_text())
    return timing["train_seconds"] + timing["eval_seconds"]


def run_all(specs: Sequence[RunSpec], output: Path, tp: int = 1, jobs: int = 2, threads: int = 1,
            on_done: Callable[[JobResult], None] | None = None) -> list[JobResult]:
    """Run every job, `jobs` at a time (each job is one process, or `tp` processes)."""
    output.mkdir(parents=True, exist_ok=True)
    results: list[JobResult] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = []
        for spec in specs:
            futures.append(pool.submit(run_job, spec, output, tp, threads))
        for future in futures:
            result = future.result()
            results.append(result)
            if on_done is not None:
                on_done(result)
    failed = [r.error for r in results if r.error]
    if failed:
        raise RuntimeError("ablation jobs failed:\n  " + "\n  ".join(failed))
    return results


# ------------------------------------------------------------------------------------------ results


@dataclass
class RunResults:
    """A finished run: its training log and its per-checkpoint evaluation."""

    spec: RunSpec
    metrics: list[dict[str, Any]]  # metrics.jsonl records (training and eval)
    checkpoints: list[dict[str, Any]]  # evaluate() results, by iteration (0 = untrained)

    def train_curve(self, key: str = "loss") -> tuple[list[int], list[float]]:
        """(iterations, values) of a metrics.jsonl key."""
        recs = [r for r in self.metrics if key in r]
        return [r["iteration"] for r in recs], [r[key] for r in recs]

    def nll_curve(self) -> tuple[list[int], list[float]]:
        """Training NLL of the model's output distribution: the mixture's for CPLM (`mix_loss`; its `loss` is the
        whole objective, auxiliary LM term included), the LM's for the baseline: what compares across arms."""
        its, vals = self.train_curve("mix_loss")
        return (its, vals) if its else self.train_curve("loss")

    def eval_curve(self, task: str, metric: str) -> tuple[list[int], list[float]]:
        """(iterations, values) of one evaluation metric over the checkpoints."""
        its, vals = [], []
        for entry in self.checkpoints:
            if task in entry["tasks"]:
                its.append(entry["iteration"])
                vals.append(entry["tasks"][task]["metrics"][metric])
        return its, vals

    @property
    def final(self) -> dict[str, Any]:
        """The evaluation of the last checkpoint."""
        return self.checkpoints[-1]


def load_run(spec: RunSpec, output: Path) -> RunResults:
    """Read a finished run's metrics.jsonl and eval.json."""
    run_dir = output / "runs" / spec.name
    metrics_path, eval_path = run_dir / "metrics.jsonl", run_dir / "eval.json"
    for path in (metrics_path, eval_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run {spec.name} did not finish (see {run_dir}/*.log)")
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    evaluated = json.loads(eval_path.read_text())
    checkpoints = evaluated.get("checkpoints", [evaluated])  # --all-checkpoints, or the last checkpoint alone
    return RunResults(spec, metrics, sorted(checkpoints, key=lambda e: e["iteration"]))


def first_reaching(iterations: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """The first evaluated iteration whose value is >= threshold (None: never)."""
    return next((it for it, v in zip(iterations, values) if v >= threshold), None)


def staying_from(iterations: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """The first evaluated iteration from which every later value is >= threshold (None: not at the end)."""
    start = None
    for it, v in zip(iterations, values):
        if v < threshold:
            start = None
        elif start is None:
            start = it
    return start


@dataclass
class PairSummary:
    """Baseline vs CPLM of one group, side by side."""

    group: str
    baseline: RunResults
    cplm: RunResults


def pair_up(runs: Sequence[RunResults]) -> list[PairSummary]:
    """Group runs into (baseline, CPLM) pairs, in plan order."""
    by_group: dict[str, dict[bool, RunResults]] = {}
    for run in runs:
        by_group.setdefault(run.spec.group, {})[run.spec.copy_head] = run
    pairs = []
    for group, members in by_group.items():
        if set(members) != {False, True}:
            raise ValueError(f"group {group} lacks its {'CPLM' if False in members else 'baseline'} run")
        pairs.append(PairSummary(group, members[False], members[True]))
    return pairs
