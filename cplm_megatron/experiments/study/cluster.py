"""The recipe study on a SLURM cluster: one command submits every run, one aggregates them when done.

    .venv/bin/python tools/study_cluster.py submit --output runs/study --scales 135m,360m --data /data/corpus
    .venv/bin/python tools/study_cluster.py collect --output runs/study

Every (scale, arm, seed) of the study (study/plan.py's arms) is two jobs: training through
`slurm/pretrain_<scale>.sh` (its recipe and #SBATCH directives; slurm/launch.sh requeues it on exit 75, so a
preempted or timed-out run resumes from its checkpoint under the same job id), then its evaluation
(`python -m cplm_megatron.evaluate`, the CPU study's tasks) as a job that starts after the training job succeeded
(`--dependency=afterok`). `--data` is a prepared corpus with `train/`, `dev/` and `val/` splits (tools/prepare_data.py)
tokenized for the recipe's vocabulary. Runs whose evaluation exists are not submitted again; a run whose
training finished resumes at its last iteration and only evaluates. OUTPUT/study.json lists the runs and job ids;
`collect` applies the CPU study's aggregation and decision rule to the finished runs (summary.json, report.md,
plots), provisional until every planned run is in.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from cplm_megatron.experiments.launch.launcher import recipe_of, sbatch, slurm_commands
from cplm_megatron.experiments.records import load_run
from cplm_megatron.experiments.run import Evaluation, Run
from cplm_megatron.experiments.study.plan import ACTIVE_ARMS, ARMS

SCALES = ("135m", "360m", "1p7b")  # <slurm_dir>/pretrain_<scale>.sh
# GPU-hours are estimated from the training FLOPs (model/sizing/accounting.py) at this fraction of an H100's dense
# bf16 peak (989 TFLOP/s): the MFU measured at SmolLM2-135M (seq 2048, micro-batch 8) on one H200 of the same peak
# (results/gpu/2026-12-04, 16.0%); larger models reach more (1.7B: 27-48%), so at 360M the hours are an upper bound.
ASSUMED_MFU = 0.16
H100_BF16_PEAK = 989e12


class ClusterStudyError(ValueError):
    """A study that cannot be submitted or collected as asked."""


@dataclass
class ClusterStudySettings:
    """What `submit` plans: arms x seeds x scales of the recipe study, at cluster sizes."""

    scales: tuple[str, ...] = ("135m", "360m")
    arms: tuple[str, ...] = ACTIVE_ARMS
    seeds: tuple[int, ...] = (1, 2, 3)
    data: str = ""
    iters: int = 5000
    eval_interval: int = 250
    checkpoint_interval: int = 1000
    eval_limit: int = 64  # tools/evaluate.py --limit (sequences per task; val scores every sample)
    val_all: bool = True  # val and the cache control score every validation sample (False: --limit of them)
    passkey_lengths: tuple[int, ...] = (512, 2048, 4096, 8192)
    time: str = "12:00:00"
    sbatch_args: tuple[str, ...] = ()  # every job (e.g. --partition=h100, --account=...)
    eval_sbatch_args: tuple[str, ...] = ("--gpus=1",)  # the evaluation jobs (one process)
    sets: tuple[str, ...] = ()  # training overrides applied after the study's
    slurm_dir: str = "slurm"  # where the pretrain_<scale>.sh scripts are (a checkout's slurm/)

    def validate(self) -> None:
        """ClusterStudyError naming the bad setting."""
        unknown = [a for a in self.arms if a not in ARMS] + [s for s in self.scales if s not in SCALES]
        if unknown:
            raise ClusterStudyError(f"unknown arm(s)/scale(s) {unknown}; arms: {', '.join(ARMS)}; scales: "
                                    f"{', '.join(SCALES)}")
        if "baseline" not in self.arms or len(self.arms) < 2:
            raise ClusterStudyError("the study compares CPLM arms with the baseline: --arms must hold baseline and "
                                    ">= 1 other")
        if len(set(self.seeds)) < 2:
            raise ClusterStudyError(f"a spread needs >= 2 distinct seeds, got {list(self.seeds)}")
        missing = [s for s in ("train", "dev", "val") if not (Path(self.data) / s / "manifest.json").is_file()]
        if missing:
            raise ClusterStudyError(f"--data {self.data} has no prepared {', '.join(missing)} split(s) (manifest.json); "
                                    "prepare them with tools/prepare_data.py")
        if self.iters < 1 or self.eval_interval < 1 or self.iters % self.eval_interval:
            raise ClusterStudyError(f"--iters {self.iters} must be a positive multiple of --eval-interval "
                                    f"{self.eval_interval} (the last step must be evaluated)")


@dataclass
class ClusterRun:
    """One submitted run as study.json keeps it: its training script and arguments, its evaluation's arguments."""

    name: str
    scale: str
    arm: str
    seed: int
    run_dir: str
    script: str
    train_args: list[str]
    eval_args: list[str]
    labels: dict[str, Any]
    gpu_hours: float
    jobs: dict[str, str] = field(default_factory=dict)

    def spec(self) -> Run:
        """The run the study's aggregation reads (labels: arm, scale, seed, model size, iterations, FLOPs)."""
        return Run(self.name, f"{self.scale}-s{self.seed}", (("copy_head.enabled", ARMS[self.arm].copy_head),),
                   Evaluation(("val",), every_checkpoint=False), tuple(sorted(self.labels.items())), experiment="study")


def plan(settings: ClusterStudySettings, output: Path) -> list[tuple[Run, ClusterRun]]:
    """Every run, scale by scale and seed by seed, with its submission record; each run's config is resolved (and
    checked) here."""
    from cplm_megatron.experiments.launch.launcher import eval_command, train_command
    from cplm_megatron.model.sizing.accounting import CopyHeadShape, train_flops_per_token
    from cplm_megatron.run_config import load_run_config

    settings.validate()
    data = Path(settings.data).resolve()
    runs = []
    for scale in settings.scales:
        script = Path(settings.slurm_dir).resolve() / f"pretrain_{scale}.sh"
        if not script.is_file():
            raise ClusterStudyError(f"{script} is missing: pass the checkout's slurm/ directory (slurm_dir)")
        recipe = recipe_of(script, ClusterStudyError)
        for seed in settings.seeds:
            for arm_name in settings.arms:
                arm = ARMS[arm_name]
                name = f"{scale}-{arm_name}-s{seed}"
                run_dir = output / "runs" / name
                typed = (("copy_head.enabled", arm.copy_head), ("run.seed", seed), ("data.seed", seed),
                         ("data.streams", [data / "train"]), ("data.val_streams", [data / "val"]),
                         ("train.tokens", None), ("train.iters", settings.iters),
                         ("train.eval_interval", settings.eval_interval),
                         ("train.log_interval", settings.eval_interval),
                         ("checkpoint.interval", settings.checkpoint_interval), *arm.settings,
                         *(tuple(item.split("=", 1)) for item in settings.sets))
                tasks = ("val", "copy", "passkey", "gradient") + (("cache",) if not arm.copy_head else ())
                evaluation = Evaluation(tasks, limit=settings.eval_limit, gradient_source="val",
                                        data=str(data / "val"), dev_data=str(data / "dev"), val_all=settings.val_all,
                                        passkey_lengths=tuple(settings.passkey_lengths), every_checkpoint=False)
                run = Run(name, f"{scale}-s{seed}", typed, evaluation, recipe=recipe, experiment="study")
                cfg = load_run_config(recipe, run.overrides())
                tokens = settings.iters * cfg.train.global_batch * cfg.train.seq_len
                per_token = train_flops_per_token(cfg.model, cfg.train.seq_len, CopyHeadShape.of(cfg.copy_head),
                                                  cfg.recompute.granularity)
                labels = {"arm": arm_name, "scale": scale, "seed": seed, "hidden": cfg.model.hidden_size,
                          "layers": cfg.model.num_layers, "vocab": cfg.model.vocab_size, "iters": settings.iters,
                          "copy_head": arm.copy_head, "tokens_per_step": cfg.train.global_batch * cfg.train.seq_len,
                          "train_flops_per_token": per_token}
                run = Run(name, run.group, typed, evaluation, tuple(sorted(labels.items())), recipe, "study")
                record = ClusterRun(name, scale, arm_name, seed, str(run_dir), str(script),
                                    list(train_command(run, run_dir).argv[2:]), list(eval_command(run, run_dir).argv),
                                    labels, per_token * tokens / (H100_BF16_PEAK * ASSUMED_MFU) / 3600)
                runs.append((run, record))
    return runs


def job_commands(run: Run, record: ClusterRun, settings: ClusterStudySettings, output: Path,
                 train_job: str = "TRAIN_JOB_ID") -> tuple[list[str], list[str]]:
    """The two sbatch command lines of a run: training, then its evaluation after the training job succeeded."""
    return slurm_commands(run, Path(record.run_dir), output / "logs", (f"--time={settings.time}", *settings.sbatch_args),
                          settings.eval_sbatch_args, train_script=record.script, train_job=train_job)


def submit(settings: ClusterStudySettings, output: Path, dry_run: bool = False,
           log: Callable[[str], None] = print) -> list[ClusterRun]:
    """Submit every run without an evaluation yet; writes OUTPUT/study.json (the runs and their job ids)."""
    from cplm_megatron.experiments.records import JOB_RECORD, JobRecord, write_job_record

    output = Path(output).resolve()
    planned = plan(settings, output)
    runs = [record for _, record in planned]
    total = sum(r.gpu_hours for r in runs)
    log(f"[study-cluster] {len(runs)} runs: arms {', '.join(settings.arms)} x seeds {list(settings.seeds)} x scales "
        f"{', '.join(settings.scales)}; ~{total:.0f} GPU-hours of training (H100 bf16 at {ASSUMED_MFU:.0%} MFU)")
    checkout = Path(settings.slurm_dir).resolve().parent  # the scripts find slurm/launch.sh from the submit dir
    for spec, run in planned:
        if (Path(run.run_dir) / "eval.json").is_file():
            log(f"[study-cluster] {run.name}: evaluated already, not submitted")
            continue
        train, ev = job_commands(spec, run, settings, output)
        if dry_run:
            log(shlex.join(train))
            log(shlex.join(ev))
            continue
        (output / "logs").mkdir(parents=True, exist_ok=True)
        Path(run.run_dir).mkdir(parents=True, exist_ok=True)
        write_job_record(Path(run.run_dir) / JOB_RECORD, JobRecord.of(spec, 1, output, None))
        run.jobs["train"] = sbatch(train, checkout, ClusterStudyError)
        run.jobs["eval"] = sbatch(job_commands(spec, run, settings, output, run.jobs["train"])[1], checkout,
                                  ClusterStudyError)
        log(f"[study-cluster] {run.name}: training job {run.jobs['train']}, evaluation job {run.jobs['eval']} "
            f"(~{run.gpu_hours:.1f} GPU-hours)")
    if not dry_run:
        previous = _read_study(output).get("runs", {}) if (output / "study.json").is_file() else {}
        record = {"settings": asdict(settings), "runs": {**previous, **{r.name: asdict(r) for r in runs if r.jobs}}}
        record["planned"] = [asdict(r) for r in runs]
        (output / "study.json").write_text(json.dumps(record, indent=2) + "\n")
    return runs


def _read_study(output: Path) -> dict[str, Any]:
    path = Path(output) / "study.json"
    if not path.is_file():
        raise ClusterStudyError(f"{path} is missing: submit the study first (tools/study_cluster.py submit)")
    return json.loads(path.read_text())


def collect(output: Path, command: str = "", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Aggregate the evaluated runs of a submitted study: OUTPUT/summary.json, report.md and the plots."""
    from cplm_megatron.experiments.records import write_study_summary_json
    from cplm_megatron.experiments.study.report import write_study_report
    from cplm_megatron.experiments.study.summary import summarize

    output = Path(output).resolve()
    study = _read_study(output)
    planned = [ClusterRun(**r) for r in study["planned"]]
    done = [r for r in planned if (Path(r.run_dir) / "eval.json").is_file()]
    log(f"[study-cluster] {len(done)} of {len(planned)} planned runs evaluated")
    if not done:
        raise ClusterStudyError(f"no run of {output} has been evaluated yet (squeue shows the jobs; logs: "
                                f"{output / 'logs'})")
    summary = summarize([load_run(r.spec(), output) for r in done],
                        planned=[(r.scale, r.arm, r.seed) for r in planned])
    summary.update(command=command, where="a SLURM cluster", settings=study["settings"],
                   gpu_hours_estimated=sum(r.gpu_hours for r in planned))
    write_study_summary_json(output / "summary.json", summary)
    write_study_report(output, summary)
    log(f"[study-cluster] default: {summary['decision']['default']}"
        f"{' (provisional)' if summary['decision']['provisional'] else ''}; report: {output / 'report.md'}")
    return summary
