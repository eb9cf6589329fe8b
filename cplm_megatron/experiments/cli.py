"""The command line of the experiments (tools/ablate.py; `python -m cplm_megatron.experiments.cli` where the package
is installed): Baseline vs CPLM ablation at tiny scale, or the multi-seed, two-scale recipe study.

  .venv/bin/python tools/ablate.py --output runs/ablation --quick          # CI / demo: a few minutes
  .venv/bin/python tools/ablate.py --output runs/ablation                  # full: longer runs, more variants
  .venv/bin/python tools/ablate.py --study --output runs/study             # arms x seeds x scales (hours)
  .venv/bin/python tools/ablate.py --study --smoke --output runs/study     # 3 arms x 2 seeds, a few steps (CI)
  .venv/bin/python tools/ablate.py --study --summarize-only --output runs/study   # summary of what finished
  .venv/bin/python tools/ablate.py --study-table runs/study/summary.json   # the README's table

--study trains every active arm (baseline, mixture, aux1, sentinel+aux1; the retired aux1+copy, sentinel,
aux0.5 and decoupled run only when named in --arms) x seeds 1-5 at tiny (hidden 64 x 4 layers), and the
baseline, aux1 and sentinel+aux1 x seeds 1-3 at small (hidden 128 x 8 layers, 3.6x tiny's FLOPs per token);
both on one corpus (vocabulary 4096, train/dev/val built under --data-root when missing), 2 single-threaded
runs at a time (--jobs), reusing finished runs; evaluates each on every validation
sample (document intervals) and the baselines with the continuous-cache control (baseline+cache, tuned on
dev); then applies the study's decision rule (a default changes only beyond the paired interval;
provisional until the planned grid is complete), runs SpamLang at vocabulary 131072 (hidden 64 and 128)
for baseline vs the chosen default, and writes OUTPUT/summary.json, OUTPUT/report.md and plots.

Experiments (each a baseline/CPLM pair that differs only in `copy_head.enabled`):
  corpus    the embedded corpus (--data, `make data`): hidden 64, vocab 4096; val loss, copy, passkey, gradient
  spamlang  SpamLang at vocab 4096/8192/16384 (>= 64x hidden 64), untied LM head (and tied in the full run):
            accuracy vs steps, steps to 99%, gradient figures
Writes OUTPUT/report.md (tables) and PNG plots, OUTPUT/results.json (the SpamLang claims and every
run's evaluation), and OUTPUT/runs/<run>/ (trainer output, logs, eval.json). Finished runs are reused
when the command is repeated. --tp 2 trains each run with torchrun on 2 processes (TP=2).
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.experiments.ablation.plan import AblationSettings
from cplm_megatron.experiments.launch.launcher import JobResult, run_as_runner
from cplm_megatron.experiments.pipeline import SpamLangSettings, run_ablation, run_recipe_study, summarize_study
from cplm_megatron.experiments.records import read_study_summary
from cplm_megatron.experiments.study.plan import ACTIVE_ARMS, ARMS, SCALES, SECOND_SCALE_ARMS, StudySettings
from cplm_megatron.experiments.study.report import headline_table, readme_block


def _ints(text: str):
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", help="output directory (report.md, plots, runs/); required but with --study-table")
    p.add_argument("--quick", action="store_true", help="the short variant (CI, make demo)")
    p.add_argument("--data", default="data/stdlib", help="the embedded corpus (make data); default data/stdlib")
    p.add_argument("--experiments", default="corpus,spamlang", help="comma-separated: corpus,spamlang")
    p.add_argument("--vocab-sizes", type=_ints, help="SpamLang vocabularies (default 4096,8192,16384)")
    p.add_argument("--spamlang-iters", type=int, help="SpamLang training steps")
    p.add_argument("--spamlang-interval", type=int, help="SpamLang checkpoint/evaluation interval")
    p.add_argument("--spamlang-ties", choices=("untied", "tied", "both"),
                   help="LM head of the SpamLang runs (default: untied with --quick, both otherwise)")
    p.add_argument("--corpus-iters", type=int, help="corpus training steps")
    p.add_argument("--corpus-interval", type=int, help="corpus checkpoint/evaluation interval")
    p.add_argument("--corpus-val-interval", type=int,
                   help="the corpus runs' validation interval during training (default: --corpus-interval)")
    p.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                   help="print each running job's latest progress line this often (0: only when a run finishes)")
    p.add_argument("--eval-sequences", type=int, help="sequences per evaluation task and checkpoint")
    p.add_argument("--tp", type=int, default=1, choices=(1, 2), help="tensor parallel size of each training run")
    p.add_argument("--jobs", type=int, help="runs at a time (default: 2 with --tp 1, 1 with --tp 2)")
    p.add_argument("--seed", type=int, help="run.seed and data.seed of every run (default 1234): repeat an "
                   "ablation with other seeds to see its run-to-run spread")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="trainer overrides for every run, applied last (e.g. copy_head.lm_loss_weight=1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    study = p.add_argument_group("recipe study (--study)")
    study.add_argument("--study", action="store_true", help="the multi-seed, two-scale recipe study")
    study.add_argument("--smoke", action="store_true", help="with --study: every arm, 2 seeds, tiny scale, a few steps")
    study.add_argument("--arms", help=f"comma-separated arms at every scale (default: {','.join(ACTIVE_ARMS)} at "
                       f"tiny, {','.join(SECOND_SCALE_ARMS)} at small; also: "
                                      f"{','.join(a for a in ARMS if a not in ACTIVE_ARMS)})")
    study.add_argument("--seeds", type=_ints, help="seeds at every scale (default: 1-5 at tiny, 1-3 at small)")
    study.add_argument("--scales", help=f"comma-separated scales (default: {','.join(SCALES)})")
    study.add_argument("--data-root", default="data", help="where the study's corpora are (built when missing)")
    study.add_argument("--no-spamlang", action="store_true", help="skip the SpamLang runs at vocabulary >= 100k")
    study.add_argument("--summarize-only", action="store_true",
                       help="with --study: summary.json, report and plots of the runs finished so far; trains nothing")
    p.add_argument("--study-table", metavar="SUMMARY_JSON", help="print the README's table of a study and exit")
    return p.parse_args(argv)


def study_settings_from_args(args: argparse.Namespace) -> StudySettings:
    """StudySettings (or .smoke()) with the command-line selections; ValueError naming a bad one."""
    s = StudySettings.smoke() if args.smoke else StudySettings()
    changes = {"arms": args.arms and tuple(a.strip() for a in args.arms.split(",") if a.strip()),
               "seeds": args.seeds, "scales": args.scales and tuple(x.strip() for x in args.scales.split(",") if x.strip())}
    s = dataclasses.replace(s, **{k: v for k, v in changes.items() if v})
    if args.seeds:  # the same seeds at every scale
        s = dataclasses.replace(s, scale_seeds={})
    if args.arms:  # the same arms at every scale
        s = dataclasses.replace(s, scale_arms={})
    s.validate()
    return s


def main_study(args: argparse.Namespace, argv: list[str]) -> int:
    """--study: run (or reuse) the study's runs, decide, write summary.json and the report."""
    settings = study_settings_from_args(args)
    spamlang = None if args.no_spamlang else (SpamLangSettings.smoke() if args.smoke else SpamLangSettings())

    def progress(result: JobResult) -> None:
        print(f"[study] {result.status_line()}", flush=True)

    if args.summarize_only:
        outcome = summarize_study(Path(args.output), settings, Path(args.data_root),
                                  command="tools/ablate.py " + shlex.join(argv), log=lambda m: print(m, flush=True))
    else:
        outcome = run_recipe_study(Path(args.output), settings, Path(args.data_root), spamlang,
                                   jobs=args.jobs or 2, threads=args.threads,
                                   command="tools/ablate.py " + shlex.join(argv), on_done=progress,
                                   log=lambda m: print(m, flush=True))
    print(headline_table(outcome.summary))
    decision = outcome.summary["decision"]
    status = (f"provisional: {decision['planned_runs_missing']} of {decision['planned_runs']} planned runs missing"
              if decision.get("provisional") else "the planned grid is complete")
    print(f"[study] default: {decision['default']} ({status}) — {decision['reason']}")
    print(f"[study] report: {outcome.report}; summary: {outcome.summary_json}")
    return 0


def settings_from_args(args: argparse.Namespace) -> AblationSettings:
    """AblationSettings.quick()/full() with the command-line overrides."""
    s = AblationSettings.quick() if args.quick else AblationSettings.full()
    experiments = tuple(e.strip() for e in args.experiments.split(",") if e.strip())
    unknown = [e for e in experiments if e not in ("corpus", "spamlang")]
    if unknown or not experiments:
        raise ValueError(f"--experiments: unknown {unknown or args.experiments!r}; choose from corpus,spamlang")
    ties = {"untied": (False,), "tied": (True,), "both": (False, True), None: s.spamlang_ties}[args.spamlang_ties]
    for override in args.overrides:
        key = override.split("=", 1)[0]
        if "=" not in override or key in ("copy_head.enabled", "run.dir"):
            raise ValueError(f"--set {override!r}: give KEY=VALUE trainer overrides other than copy_head.enabled and "
                             f"run.dir (the ablation sets those per run)")
    changes = {"experiments": experiments, "spamlang_ties": ties, "spamlang_vocabs": args.vocab_sizes,
               "spamlang_iters": args.spamlang_iters, "spamlang_interval": args.spamlang_interval,
               "corpus_iters": args.corpus_iters, "corpus_interval": args.corpus_interval,
               "corpus_val_interval": args.corpus_val_interval,
               "eval_sequences": args.eval_sequences, "seed": args.seed,
               "extra_settings": tuple(tuple(o.split("=", 1)) for o in args.overrides) or None}
    s = dataclasses.replace(s, **{k: v for k, v in changes.items() if v is not None})
    for name in ("spamlang_iters", "spamlang_interval", "corpus_iters", "corpus_interval", "eval_sequences"):
        if getattr(s, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(s, name)}")
    small = [v for v in s.spamlang_vocabs if v < 64 * s.hidden_size]
    if small:
        print(f"note: SpamLang vocabularies {small} are below 64x the hidden size {s.hidden_size}", file=sys.stderr)
    return s


@exit_2_on(ValueError, FileNotFoundError)
def main(argv: list[str] | None = None) -> int:
    """tools/ablate.py: bad input is one `error:` line and exit 2, failed jobs one line and exit 1; Ctrl-C (SIGTERM,
    SIGHUP) one line and 75 (every stopped run checkpointed) or 130, whatever signal handling it inherited."""
    return run_as_runner(lambda: _main(argv), "ablate")


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    if args.jobs is not None and args.jobs < 1:  # 0 chose the default and -1 ran one at a time, silently
        raise ValueError(f"--jobs must be >= 1 (runs at a time), got {args.jobs}; leave it out for the default")
    if args.study_table:
        print(readme_block(read_study_summary(Path(args.study_table))))
        return 0
    if not args.output:
        raise ValueError("--output DIR is required (where the runs, report.md and plots go)")
    if args.study:
        return main_study(args, argv)
    settings = settings_from_args(args)
    jobs = args.jobs or (2 if args.tp == 1 else 1)
    finished: list[JobResult] = []

    def progress(result: JobResult) -> None:
        finished.append(result)
        print(f"[ablate] {result.status_line()}", flush=True)

    print(f"[ablate] output {Path(args.output).resolve()}, {jobs} run(s) at a time", flush=True)
    outcome = run_ablation(Path(args.output), settings, Path(args.data), tp=args.tp, jobs=jobs,
                           threads=args.threads, command="tools/ablate.py " + shlex.join(argv), on_done=progress,
                           progress_every=args.progress_every)
    for c in outcome.spamlang:
        base = c["baseline_steps_to_99"]
        base_text = f"at step {base}" if base is not None else f"not within {c['iters']} steps"
        print(f"[ablate] SpamLang V={c['vocab']} ({'tied' if c['tied'] else 'untied'} LM head): CPLM >= 99% at step "
              f"{c['cplm_steps_to_99']}, baseline {base_text}")
    print(f"[ablate] report: {outcome.report} ({outcome.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
