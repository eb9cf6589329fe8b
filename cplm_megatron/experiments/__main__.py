"""One command line for every experiment, by name (registry.py finds them):

  .venv/bin/python -m cplm_megatron.experiments --list
  .venv/bin/python -m cplm_megatron.experiments NAME --output DIR [--data PATH] [--variant smoke] [--jobs N]
  .venv/bin/python -m cplm_megatron.experiments NAME --output DIR --report-only     # what finished; trains nothing
  .venv/bin/python -m cplm_megatron.experiments NAME --output DIR --plan            # the runs; trains nothing

An experiment with a command line of its own (emergence: tools/emergence.py, scaling: tools/scaling_study.py) gets
every argument after NAME instead. Otherwise its settings are its settings type's defaults, or the classmethod
--variant names (smoke, quick, full). Bad input is one `error:` line and exit 2, failed runs one line and exit 1,
Ctrl-C one line and 75 (every stopped run checkpointed) or 130; finished runs are reused when repeated.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.errors import UserError
from cplm_megatron.experiments.launch.launcher import run_as_runner
from cplm_megatron.experiments.registry import Context, Experiment, experiment, registry


def parse_args(name: str, argv: list[str]) -> argparse.Namespace:
    """The common options of an experiment without a command line of its own."""
    p = argparse.ArgumentParser(prog=f"python -m cplm_megatron.experiments {name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", type=Path, required=True, help="output directory (runs/, the report)")
    p.add_argument("--data", type=Path, help="its data: a corpus, or the root its corpora are built under")
    p.add_argument("--variant", help="a classmethod of the settings type giving them (smoke, quick, full)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--report-only", action="store_true", help="the report of what finished; trains nothing")
    p.add_argument("--plan", action="store_true", help="print the runs; trains nothing")
    return p.parse_args(argv)


def settings_of(spec: Experiment, variant: str | None) -> Any:
    """The experiment's settings: its type's defaults, or the classmethod `variant`."""
    if variant is None:
        return spec.settings()
    make = getattr(spec.settings, variant, None)
    if not isinstance(getattr(spec.settings, "__dict__", {}).get(variant), classmethod) or make is None:
        known = [k for k, v in vars(spec.settings).items() if isinstance(v, classmethod)]
        raise UserError(f"--variant {variant!r}: {spec.name}'s settings have no such variant; known: "
                        f"{', '.join(known) or 'none (leave --variant out)'}")
    return make()


def run_named(spec: Experiment, argv: list[str]) -> int:
    """Plan, run or report `spec` with the common options."""
    args = parse_args(spec.name, argv)
    ctx = Context(args.output.resolve(), args.data.resolve() if args.data else None, jobs=args.jobs,
                  threads=args.threads, command=f"python -m cplm_megatron.experiments {spec.name} " + shlex.join(argv),
                  on_done=lambda result: print(f"[{spec.name}] {result.status_line()}", flush=True),
                  log=lambda message: print(message, flush=True))
    settings = settings_of(spec, args.variant)
    if args.plan:
        for run in spec.plan(settings, ctx):
            print(getattr(run, "name", run))
        return 0
    outcome = (spec.report if args.report_only else spec.run)(settings, ctx)
    report = getattr(outcome, "report", outcome)
    print(f"[{spec.name}] report: {report}")
    return 0


@exit_2_on(ValueError, FileNotFoundError, UserError)
def main(argv: list[str] | None = None) -> int:
    """`python -m cplm_megatron.experiments NAME ...`: the experiment's own command line, or the common one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__ if argv[:1] != ["--list"] else "")
        for name, spec in sorted(registry().items()):
            print(f"  {name:<12} {spec.about}")
        return 0
    spec = experiment(argv[0])
    if spec.main is not None:
        return spec.main(argv[1:])
    return run_as_runner(lambda: run_named(spec, argv[1:]), spec.name)

if __name__ == "__main__":
    sys.exit(main())
