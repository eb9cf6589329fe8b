#!/usr/bin/env python
"""Aggregate scaling-study records into a markdown report and PNG plots (cplm_megatron/experiments/scaling/report.py).

  .venv/bin/python tools/scaling_report.py runs/scaling/h100/runs --output runs/scaling/h100/report

Reads every run record (run_record.json; summary.json in runs trained before the rename) under RECORDS_DIR and
writes report.md (runs, scaling efficiency, copy-head overhead), throughput_vs_nodes.png, scaling_efficiency.png
and cplm_overhead.png to --output.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on
from cplm_megatron.experiments.scaling.report import (  # noqa: F401 - the tool's interface
    ReportError,
    cplm_overheads,
    load_records,
    scaling_series,
    write_report,
)


@exit_2_on(ReportError)
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", nargs="+", type=Path, help="directories searched (recursively) for run records")
    p.add_argument("--output", type=Path, required=True, help="directory for report.md and the PNG plots")
    args = p.parse_args(argv)
    report = write_report(args.records, args.output)
    print(f"[scaling_report] wrote {report} and plots in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
