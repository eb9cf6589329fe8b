"""The GPU check's `study` step: where in-context copying emerges, baseline against the recipe's CPLM, both trained for
the same tokens (set by a time budget) on the code corpus of this machine's own installed Python sources, probed
every N steps, and scored beside their controls.

    python -m benchmarks.gpu.study_step WORK_DIR [--tiny] [--budget SECONDS]
    python -m cplm_megatron.experiments gpu_study WORK_DIR [--tiny] [--budget SECONDS]

Runs with the project, megatron-core and the carried wheels (mosaicml-streaming and its compiled needs) installed
(the GPU check runs it from its scratch tree, the project from its wheel). One process; WORK_DIR/study.json is
rewritten as each phase ends (a budget cut keeps what finished). Phases, within `--budget` seconds from the start:

1. corpus: cplm_megatron.data.code_corpus over this interpreter's standard library and site-packages with the
   corpus's own split rules (the GPU's: whatever the package set, the split adapts and split.json says how; held-out
   files written one package at a time in turn, so the scored validation samples span the packages).
2. train, the CPLM first: a 4-layer, 256-wide Llama (SIZES.model) sized so each arm trains ~1e8 tokens in its share
   of the budget on an H200 (`estimated_tokens_per_sec`; measured on the next lease): the time left after the corpus,
   less what scoring needs, split in two. The CPLM trains until its share is spent (a SIGUSR1 from a timer: the
   trainer's graceful stop, a checkpoint at the next step) or its iteration cap; the baseline then trains exactly as
   many iterations (`train.exit_after_iters`) on the same schedule (warm-up, then constant), data order and seed.
   Both log `probe_copy_accuracy` and `probe_in_context_score` every `probe_interval` steps (train.probe_interval:
   the step where copying emerges; the validation loader the in-context score reads is built by
   train.eval_interval, set to the iteration cap).
3. score_val: both arms' validation loss and the baseline + continuous cache control (lambda/theta tuned on the dev
   split), CPLM - baseline and CPLM - (baseline + cache) paired over the same documents: before anything else.
4. score_tasks: the copy task beside chance and the one-token-match copier, the passkey task beside chance.

--tiny: the CPU dry run's sizes (a 2-layer, 64-wide model, a 4 MB corpus with the same split rules, a 25 s share
per arm): it checks the step, not a result. Exit 0 when every phase finished, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.experiments.gpu_study.record import STUDY_RECORD, Record, run_phase
from cplm_megatron.experiments.gpu_study.sizes import ARMS, GPU, TINY, Sizes
from cplm_megatron.experiments.registry import Context, Experiment

PROG = "python -m cplm_megatron.experiments gpu_study"


@dataclass(frozen=True)
class GpuStudySettings:
    """The study's sizes (the GPU's, or the CPU dry run's with `tiny`) and its budget in seconds (None: the sizes')."""

    tiny: bool = False
    budget_s: float | None = None

    @classmethod
    def smoke(cls) -> GpuStudySettings:
        """The CPU dry run's sizes."""
        return cls(tiny=True)

    @property
    def sizes(self) -> Sizes:
        """The sizes the settings ask for."""
        return TINY if self.tiny else GPU

    @property
    def budget(self) -> float:
        """Seconds the study may take."""
        return self.budget_s or self.sizes.budget_s


def run_study(work: Path, settings: GpuStudySettings) -> tuple[Record, bool]:
    """Every phase within the budget, study.json rewritten as each ends; (the record, whether every phase finished)."""
    from cplm_megatron.experiments.gpu_study.corpus import build_corpus
    from cplm_megatron.experiments.gpu_study.scoring import score_tasks, score_val
    from cplm_megatron.experiments.gpu_study.throughput import estimate
    from cplm_megatron.experiments.gpu_study.training import train_both

    sizes = settings.sizes
    deadline = time.monotonic() + settings.budget
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    record = Record(work, sizes, settings.tiny, settings.budget)
    box: dict[str, Path] = {}
    ok = run_phase(record, "corpus", lambda: box.update(corpus=build_corpus(work, sizes, record)))
    if ok:
        record.data["estimate"] = estimate(sizes, record.data["corpus"]["vocab_size"])
        ok = train_both(work, sizes, box["corpus"], record, deadline)
    if ok:  # both arms' validation loss and the cache control first: a cut then loses only the synthetic tasks
        ok = run_phase(record, "score_val", lambda: score_val(work, sizes, box["corpus"], record))
        ok = run_phase(record, "score_tasks", lambda: score_tasks(work, sizes, box["corpus"], record)) and ok
    record.data["complete"] = ok
    record.write()
    print(f"[study] {'complete' if ok else 'INCOMPLETE'}: {record.path}", flush=True)
    return record, ok


def plan(settings: GpuStudySettings, ctx: Context) -> list[str]:
    """The arms' run dirs under OUTPUT/runs, in training order (the CPLM first)."""
    from cplm_megatron.experiments.gpu_study.training import arm_dir

    return [str(arm_dir(Path(ctx.output), arm)) for arm in ARMS]


def run(settings: GpuStudySettings, ctx: Context) -> Path:
    """Every phase in OUTPUT (the study is one process and trains afresh); OUTPUT/study.json."""
    return run_study(Path(ctx.output), settings)[0].path


def report(settings: GpuStudySettings, ctx: Context) -> Path:
    """OUTPUT/study.json as the phases that finished left it (FileNotFoundError naming it when none ran); trains
    nothing."""
    path = Path(ctx.output) / STUDY_RECORD
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run the study first ({PROG} {ctx.output})")
    return path


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The study's command line (WORK_DIR [--tiny] [--budget SECONDS]): exit 0 when every phase finished, else 1."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, help="the check's working directory (study.json goes there)")
    p.add_argument("--tiny", action="store_true", help="the CPU dry run's sizes")
    p.add_argument("--budget", type=float, help="seconds the step may take (default: the sizes' budget)")
    args = p.parse_args(argv)
    return 0 if run_study(args.work, GpuStudySettings(tiny=args.tiny, budget_s=args.budget))[1] else 1


def experiments_main(argv: list[str] | None = None) -> int:
    """`python -m cplm_megatron.experiments gpu_study ...`: the study's command line under that name."""
    return main(argv, prog=PROG)


EXPERIMENT = Experiment("gpu_study", "baseline vs CPLM, the same tokens in a time budget, on this machine's Python "
                        "sources (benchmarks/gpu/study_step.py)",
                        GpuStudySettings, plan=plan, run=run, report=report, main=experiments_main)

if __name__ == "__main__":
    sys.exit(main())
