"""What an experiment's runs leave behind, each record with one reader: the job record (job.json: what a run was
launched with), its timing (timing.json), and a finished run's results (metrics.jsonl + eval.json).

job.json is versioned. Version 2 holds the run as data (recipe, settings as `--set` text, the evaluation's
options, the process count) with `{output}` and `{data}` standing for the study and data directories, so a
finished run is reused after either moved. Version 1 (no "version" key: the train and eval command lines of
`pretrain/pretrain_cplm.py` and `tools/evaluate.py` in a checkout, `{repo}` for the checkout) is migrated when
read: `{repo}/data/` becomes `{data}/`, `{repo}/configs/NAME.yaml` the shipped recipe NAME; the file is not
rewritten (a study still running with the old code keeps reading it).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.durable_files import write_atomic
from cplm_megatron.errors import check_version
from cplm_megatron.evaluation.results import read_eval_results
from cplm_megatron.experiments.run import Evaluation, Run
from cplm_megatron.training.metrics_log import read_metrics
from cplm_megatron.training.run_record import RunRecord, has_run_record, read_run_record

JOB_RECORD = "job.json"
TIMING = "timing.json"  # a job's training and evaluation seconds, every attempt counted
JOB_RECORD_VERSION = 2


class RecordError(ValueError):
    """A record that cannot be read: names the file and the fix."""


@dataclass(frozen=True)
class JobRecord:
    """How a run was launched: its recipe, settings (`--set` text by key; run.dir excluded), evaluation options and
    process count; paths under the output and data directories as `{output}` and `{data}`."""

    recipe: str
    settings: dict[str, str]
    evaluation: dict[str, Any]
    processes: int = 1
    version: int = JOB_RECORD_VERSION

    @classmethod
    def of(cls, run: Run, processes: int, output: Path, data_root: Path | None) -> JobRecord:
        """The record `run` gets when launched with `processes` processes under `output`."""
        settings = dict(o.split("=", 1) for o in run.overrides())
        if processes > 1:
            settings["parallel.tp"] = str(processes)
        evaluation = json.loads(json.dumps(dataclasses.asdict(run.evaluation)))
        return cls(run.recipe, settings, evaluation, processes).portable(output, data_root)

    def _mapped(self, change) -> JobRecord:
        def walk(value: Any) -> Any:
            if isinstance(value, str):
                return change(value)
            if isinstance(value, list):
                return [walk(v) for v in value]
            if isinstance(value, dict):
                return {k: walk(v) for k, v in value.items()}
            return value

        return dataclasses.replace(self, recipe=walk(self.recipe), settings=walk(self.settings),
                                   evaluation=walk(self.evaluation))

    def portable(self, output: Path, data_root: Path | None) -> JobRecord:
        """Paths under `output` / `data_root` written as `{output}` / `{data}`."""
        pairs = [(str(Path(output).resolve()), "{output}")]
        if data_root is not None:
            pairs.append((str(Path(data_root).resolve()), "{data}"))

        def change(text: str) -> str:
            for path, mark in pairs:
                text = text.replace(path, mark)
            return text

        return self._mapped(change)

    def expanded(self, output: Path, data_root: Path | None) -> JobRecord:
        """`{output}` / `{data}` replaced by the directories they stand for now."""
        data = str(Path(data_root).resolve()) if data_root is not None else "{data}"
        return self._mapped(lambda text: text.replace("{output}", str(Path(output).resolve())).replace("{data}", data))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "recipe": self.recipe, "processes": self.processes,
                "settings": self.settings, "evaluation": self.evaluation}


def _bad(path: Path, why: str) -> RecordError:
    return RecordError(f"{path} is not {why}; remove {path.parent} to retrain that run, or restore the file")


def _migrate_v1(data: dict[str, Any], path: Path) -> JobRecord:
    """A version-1 record (command lines) as the run it describes."""
    train, ev = [str(a) for a in data["train"]], [str(a) for a in data["eval"]]
    processes = 1
    if "-m" in train and "torch.distributed.run" in train:
        processes = next((int(a.split("=", 1)[1]) for a in train if a.startswith("--nproc_per_node=")), 1)
    try:
        recipe = train[train.index("--config") + 1]
        sets = train[train.index("--set") + 1:]
    except (ValueError, IndexError):
        raise _bad(path, "a job record this version can migrate (no --config/--set in its train command)") from None
    if recipe.startswith("{repo}/configs/") and recipe.endswith(".yaml"):
        recipe = recipe[len("{repo}/configs/"):-len(".yaml")]
    settings = {}
    for item in sets:
        key, _, value = item.partition("=")
        if key != "run.dir":
            settings[key] = value
    options: dict[str, Any] = {"every_checkpoint": False, "val_all": False}
    flags = {"--limit": ("limit", int), "--gradient-source": ("gradient_source", str), "--data": ("data", str),
             "--dev-data": ("dev_data", str), "--copy-length": ("copy_length", int),
             "--spamlang-length": ("spamlang_length", int),
             "--tasks": ("tasks", lambda t: t.split(",")),
             "--passkey-lengths": ("passkey_lengths", lambda t: [int(x) for x in t.split(",")]),
             "--passkey-depths": ("passkey_depths", lambda t: [float(x) for x in t.split(",")])}
    args = iter(ev[1:])  # ev[0]: the evaluator's script
    for arg in args:
        if arg in ("--checkpoint", "--output"):
            next(args, None)
        elif arg == "--no-progress" or arg == "--include-initial":
            continue
        elif arg == "--all-checkpoints":
            options["every_checkpoint"] = True
        elif arg == "--val-all":
            options["val_all"] = True
        elif arg in flags:
            name, convert = flags[arg]
            options[name] = convert(next(args))
        else:
            raise _bad(path, f"a job record this version can migrate (evaluation option {arg!r})")
    if "tasks" not in options:
        raise _bad(path, "a job record this version can migrate (its evaluation names no --tasks)")
    defaults = json.loads(json.dumps(dataclasses.asdict(Evaluation(tuple(options["tasks"])))))
    record = JobRecord(recipe, settings, {**defaults, **options}, processes)
    return record._mapped(lambda text: text.replace("{repo}/data/", "{data}/"))


def read_job_record(path: Path) -> JobRecord:
    """A run dir's job.json, version 2 or migrated from version 1; RecordError naming the file and the fix."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"a readable job record ({e})") from None
    if not isinstance(data, dict):
        raise _bad(path, "a job record (it needs 'train' and 'eval' command lists, or a version)")
    version = data.get("version")
    if version is None:
        if not all(isinstance(data.get(k), list) for k in ("train", "eval")):
            raise _bad(path, "a job record (it needs 'train' and 'eval' command lists, or a version)")
        return _migrate_v1(data, path)
    if version != JOB_RECORD_VERSION:
        raise RecordError(f"{path} is a job record of version {version}; this cplm_megatron reads versions 1 and "
                          f"{JOB_RECORD_VERSION}: run the study with the cplm_megatron that wrote it, or remove "
                          f"{path.parent} to retrain that run")
    try:
        return JobRecord(str(data["recipe"]), dict(data["settings"]), dict(data["evaluation"]),
                         int(data["processes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise _bad(path, f"a complete job record ({type(e).__name__}: {e})") from None


def write_job_record(path: Path, record: JobRecord) -> None:
    """job.json, whole or not at all (a full disk leaves no half record that would refuse the relaunch)."""
    write_atomic(Path(path), json.dumps(record.to_json(), indent=2) + "\n")


STUDY_SUMMARY_VERSION = 1  # a study's summary.json; files without a version (written before it) are version 1


def write_study_summary_json(path: Path, summary: dict[str, Any]) -> Path:
    """A study's aggregate (its summary.json), with the format's version first."""
    write_atomic(Path(path), json.dumps({"version": STUDY_SUMMARY_VERSION, **summary}, indent=2) + "\n")
    return Path(path)


def read_study_summary(path: Path) -> dict[str, Any]:
    """A study's summary.json; RecordError naming the file when it is unreadable, of another version or not a
    study's aggregate."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RecordError(f"{path} is not a readable study summary ({e}); summarize the study again "
                          "(tools/ablate.py --study --summarize-only)") from None
    if not isinstance(data, dict) or not {"scales", "decision"} <= set(data):
        raise RecordError(f"{path} is not a study's summary (no scales/decision); a run's throughput record is "
                          "run_record.json")
    check_version(path, data, "a study summary", STUDY_SUMMARY_VERSION, RecordError,
                  "summarize the study again with it")
    return data


def read_timing(path: Path) -> dict[str, Any] | None:
    """A job's timing.json (None when there is none); RecordError naming the file and the fix when it is not a
    timing record."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        timing = json.loads(path.read_text())
        for key in ("train_seconds", "eval_seconds"):
            timing[key] = float(timing.get(key, 0.0))
        return timing
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError) as e:
        raise RecordError(f"{path} is not a readable timing record ({type(e).__name__}: {e}); remove it (the run's "
                          f"time is then counted from its next attempt) or restore it") from None


def run_seconds(run_dir: Path) -> float | None:
    """Training + evaluation seconds of a finished job, every attempt counted (None when it recorded none)."""
    timing = read_timing(Path(run_dir) / TIMING)
    return None if timing is None else timing["train_seconds"] + timing["eval_seconds"]


# ------------------------------------------------------------------------------------------ results


@dataclass
class RunResults:
    """A finished run: its training log and its per-checkpoint evaluation."""

    spec: Run
    metrics: list[dict[str, Any]]  # metrics.jsonl records (training and eval)
    checkpoints: list[dict[str, Any]]  # evaluate() results, by iteration (0 = untrained)
    record: RunRecord | None = None  # the trainer's run record (throughput, layout, FLOPs per token)

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


def load_run(spec: Run, output: Path) -> RunResults:
    """Read a finished run's metrics.jsonl and eval.json."""
    run_dir = Path(output) / "runs" / spec.name
    metrics_path, eval_path = run_dir / "metrics.jsonl", run_dir / "eval.json"
    for path in (metrics_path, eval_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run {spec.name} did not finish (see {run_dir}/*.log)")
    record = read_run_record(run_dir) if has_run_record(run_dir) else None
    return RunResults(spec, read_metrics(run_dir), read_eval_results(eval_path).checkpoints, record)
