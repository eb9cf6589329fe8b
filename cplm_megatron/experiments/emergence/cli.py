"""tools/emergence.py: does the copy head still help once the baseline copies? (`--help` for the whole story)

  .venv/bin/python tools/emergence.py --pilot --output results/emergence_cpu      # baselines: where copying emerges
  .venv/bin/python tools/emergence.py --output results/emergence_cpu              # the grid (hours; resumable)
  .venv/bin/python tools/emergence.py --summarize-only --output results/emergence_cpu
  .venv/bin/python tools/emergence.py --smoke --output runs/emergence             # every step at tiny sizes (CI)

The grid: baseline and aux1 (the recipes' copy-head objective) x seeds 1-3 x two domains, code (the installed
Python sources) and English prose (Debian's documentation packages), each with its own tokenizer (vocabulary
4096); hidden 64 x 4 layers, 4 sequences of 256 tokens per step, 25,000 steps (25.6M tokens per run), a quarter of
the training samples with a repeated span of their own text (data.repeat_span_share, the same samples in every
arm). Every run logs copy accuracy and the in-context score every 1,000 steps; its last checkpoint is scored on
every validation sample, the copy task and (baseline) the continuous-cache control. The recipe study's rule
decides per domain, credited only where every seed's baseline copies held-out text: its text copy gain (accuracy
on a validation document's repeated span over the same tokens' first occurrence) >= 0.1. Corpora are built under
--data-root when missing (the prose corpus needs its Debian packages: `make data-emergence`). Finished runs are reused;
a run stopped by Ctrl-C resumes from its checkpoint.
"""
from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError
from cplm_megatron.experiments.emergence.plan import EmergenceSettings, PilotSettings
from cplm_megatron.experiments.launch.launcher import JobResult, RunsInterrupted, stop_signals_interrupt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="output directory (summary.json, report.md, emergence.png, runs/)")
    p.add_argument("--data-root", default="data", help="where the corpora are (built when missing)")
    p.add_argument("--pilot", action="store_true", help="run the pilot's baselines instead of the grid")
    p.add_argument("--summarize-only", action="store_true", help="summarize what finished; train nothing")
    p.add_argument("--smoke", action="store_true", help="the whole pipeline at tiny sizes (CI)")
    p.add_argument("--domains", help="comma-separated domains (default: code,prose)")
    p.add_argument("--seeds", help="comma-separated seeds (default: 1,2,3)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1: pin the tool to one core)")
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> EmergenceSettings:
    """The grid's settings with the command line's selections; ValueError naming a bad one."""
    s = EmergenceSettings.smoke() if args.smoke else EmergenceSettings()
    if args.domains:
        s = dataclasses.replace(s, domains=tuple(d.strip() for d in args.domains.split(",") if d.strip()))
    if args.seeds:
        try:
            s = dataclasses.replace(s, seeds=tuple(int(x) for x in args.seeds.split(",") if x.strip()))
        except ValueError:
            raise ValueError(f"--seeds: expected comma-separated integers, got {args.seeds!r}") from None
    s.validate()
    if args.jobs < 1:  # ran as 1 while saying '0 at a time'
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    return s


@exit_2_on(ValueError, FileNotFoundError, UserError)
def main(argv: list[str] | None = None) -> int:
    """Bad input is one `error:` line and exit 2, failed runs one line and exit 1, Ctrl-C the launcher's code."""
    from cplm_megatron.experiments.emergence.study import run_emergence

    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    settings = settings_from_args(args)
    pilot = None
    if args.pilot:
        pilot = PilotSettings(variants=tuple((d, settings.shape, settings.repeat_span_share)
                                             for d in settings.domains)) if args.smoke else PilotSettings()

    def progress(result: JobResult) -> None:
        print(f"[emergence] {result.status_line()}", flush=True)

    try:
        with stop_signals_interrupt():  # Ctrl-C, SIGTERM, SIGHUP, whatever the process inherited
            outcome = run_emergence(Path(args.output), settings, Path(args.data_root), pilot, args.jobs,
                                    "tools/emergence.py " + shlex.join(argv), progress,
                                    lambda m: print(m, flush=True), args.summarize_only, small_corpora=args.smoke)
    except RuntimeError as err:  # failed runs: their logs' last lines
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RunsInterrupted as stop:
        print(stop, file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # outside the runs (building corpora, writing the report): nothing of a run lost
        print("[emergence] interrupted; relaunch the same command to continue (finished runs are reused)",
              file=sys.stderr)
        return 130
    for name, verdict in outcome.summary["domains"].items():
        print(f"[emergence] {name}: {verdict['verdict']}")
    print(f"[emergence] report: {outcome.report}; summary: {outcome.summary_json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
