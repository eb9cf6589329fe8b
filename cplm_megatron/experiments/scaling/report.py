"""The scaling report: scaling-study run records aggregated into a markdown report and PNG plots (CLI:
tools/scaling_report.py RECORDS_DIR... --output DIR).

A record is a training run's run_record.json (written by rank 0 at the end of a run; a run from before the
rename calls it summary.json; see tools/scaling_study.py); every one under RECORDS_DIR is read. Writes to --output:
  report.md                the runs table, scaling efficiency and copy-head (CPLM) overhead tables
  throughput_vs_nodes.png  tokens/s against node count, one line per model/layout/copy-head series
  scaling_efficiency.png   per-device throughput relative to the series' smallest run (100% = linear)
  cplm_overhead.png        extra time per token with the copy head, per model size
A plot without data (e.g. no copy-head on/off pairs) is not written; the report says why.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from cplm_megatron.experiments.toolkit import plt, save, table
from cplm_megatron.training.run_record import (
    LEGACY_NAMES,
    RUN_RECORD,
    RunRecord,
    RunRecordError,
    read_run_record,
    run_record_path,
)


class ReportError(ValueError):
    """A records directory or record that cannot be reported on."""


@dataclass(frozen=True)
class Record:
    """One run's throughput record (training/run_record.RunRecord, its throughput figures present) as a row of
    the report."""

    path: Path
    run: RunRecord

    @property
    def layout(self) -> str:
        """Compact layout name: tp2pp2vpp4sp."""
        lay = self.run.layout
        return f"tp{lay.tp}pp{lay.pp}" + (f"vpp{lay.vpp}" if lay.vpp else "") + ("sp" if lay.sp else "")

    @property
    def series(self) -> tuple[str, bool, str, int, int]:
        """Runs that differ only in node count (and so data parallelism)."""
        return (self.run.preset, self.run.copy_head, self.layout, self.run.seq_len, self.run.global_batch)

    @property
    def pair_key(self) -> tuple[str, int, str, int, int]:
        """Runs that differ only in the copy head."""
        return (self.run.preset, self.run.nodes, self.layout, self.run.seq_len, self.run.global_batch)


def record_of(run_dir: Path) -> Record:
    """A report row from a run dir's record (training/run_record.py reads it: run_record.json, else a legacy
    summary.json); names the file and key when one is missing."""
    try:
        run = read_run_record(run_dir)
    except RunRecordError as e:
        raise ReportError(str(e)) from None
    path = run_record_path(run_dir)
    if None in (run.tokens_per_sec, run.tflops_per_device, run.mfu, run.step_time):
        raise ReportError(f"{path}: no throughput figures (the launch trained too few steps to time)")
    return Record(path=path, run=run)


def load_records(roots: Sequence[Path]) -> list[Record]:
    """Every run record (run_record.json, or a legacy summary.json) under the given directories, sorted by model,
    copy head, layout, nodes."""
    records = []
    for root in roots:
        if not root.is_dir():
            raise ReportError(f"records directory {root} does not exist")
        run_dirs = {p.parent for name in (RUN_RECORD, LEGACY_NAMES[RUN_RECORD]) for p in root.rglob(name)}
        records += [record_of(run_dir) for run_dir in sorted(run_dirs)]
    if not records:
        raise ReportError(f"no {RUN_RECORD} (or summary.json) under {', '.join(map(str, roots))}; did the runs "
                          "finish? (each run writes it at the end; check the study's logs/)")
    size = {}  # model size order: the smallest FLOPs/token among a preset's records
    for r in records:
        size[r.run.preset] = min(size.get(r.run.preset, r.run.flops_per_token), r.run.flops_per_token)
    return sorted(records, key=lambda r: (size[r.run.preset], r.run.preset, not r.run.copy_head, r.layout, r.run.nodes))


@dataclass(frozen=True)
class ScalingPoint:
    """The mean of a series' runs at one node count, with its efficiency against the series' base."""

    nodes: int
    world_size: int
    tokens_per_sec: float
    runs: int
    efficiency: float  # (tokens/s per device) / (tokens/s per device of the smallest run of the series)


def scaling_series(records: Sequence[Record]) -> dict[tuple, list[ScalingPoint]]:
    """Series key -> points by node count; repeated runs of a configuration are averaged."""
    grouped: dict[tuple, dict[tuple[int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        grouped[r.series][(r.run.nodes, r.run.layout.world_size)].append(r.run.tokens_per_sec)
    out = {}
    for key, by_size in grouped.items():
        sizes = sorted(by_size)
        base_world = sizes[0][1]
        base_per_device = mean(by_size[sizes[0]]) / base_world
        out[key] = [ScalingPoint(n, w, mean(v), len(v), (mean(v) / w) / base_per_device)
                    for (n, w), v in ((s, by_size[s]) for s in sizes)]
    return out


@dataclass(frozen=True)
class Overhead:
    """The copy head's cost at one configuration: measured throughput and analytical FLOPs."""

    preset: str
    nodes: int
    layout: str
    baseline_tokens_per_sec: float
    cplm_tokens_per_sec: float
    baseline_flops_per_token: float
    cplm_flops_per_token: float

    @property
    def time_overhead(self) -> float:
        """Extra time per token with the copy head (0.1 = 10% slower)."""
        return self.baseline_tokens_per_sec / self.cplm_tokens_per_sec - 1.0

    @property
    def flops_overhead(self) -> float:
        """Extra model FLOPs per token with the copy head."""
        return self.cplm_flops_per_token / self.baseline_flops_per_token - 1.0


def cplm_overheads(records: Sequence[Record]) -> list[Overhead]:
    """Copy head on/off pairs of otherwise equal configurations (repeated runs averaged)."""
    runs: dict[tuple, dict[bool, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        runs[r.pair_key][r.run.copy_head].append(r)
    out = []
    for (preset, nodes, layout, _seq, _gbs), by_head in runs.items():
        if True in by_head and False in by_head:
            on, off = by_head[True], by_head[False]
            out.append(Overhead(preset, nodes, layout,
                                mean(r.run.tokens_per_sec for r in off), mean(r.run.tokens_per_sec for r in on),
                                mean(r.run.flops_per_token for r in off), mean(r.run.flops_per_token for r in on)))
    return out


def series_label(key: tuple) -> str:
    preset, copy_head, layout, seq_len, gbs = key
    return f"{preset} {'CPLM' if copy_head else 'baseline'} {layout} seq{seq_len} gbs{gbs}"


def plot_scaling(series: dict[tuple, list[ScalingPoint]], output: Path) -> list[str]:
    """throughput_vs_nodes.png and scaling_efficiency.png; returns the file names written."""
    written = []
    for name, ylabel, value in (("throughput_vs_nodes.png", "tokens/s", lambda p: p.tokens_per_sec),
                                ("scaling_efficiency.png", "scaling efficiency (%)", lambda p: 100 * p.efficiency)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, points in series.items():
            ax.plot([p.nodes for p in points], [value(p) for p in points], marker="o", label=series_label(key))
        if name == "scaling_efficiency.png":
            ax.axhline(100, color="gray", linestyle="--", linewidth=1, label="linear scaling")
        nodes = sorted({p.nodes for points in series.values() for p in points})
        ax.set_xticks(nodes)
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, output / name, dpi=120)
        written.append(name)
    return written


def plot_overhead(overheads: Sequence[Overhead], output: Path) -> list[str]:
    """cplm_overhead.png: one bar per (size, nodes, layout) pair; returns the file names written."""
    if not overheads:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [f"{o.preset}\n{o.nodes}n {o.layout}" for o in overheads]
    xs = range(len(overheads))
    ax.bar([x - 0.2 for x in xs], [100 * o.time_overhead for o in overheads], width=0.4, label="measured time/token")
    ax.bar([x + 0.2 for x in xs], [100 * o.flops_overhead for o in overheads], width=0.4, label="model FLOPs/token")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("copy-head overhead (%)")
    ax.axhline(0, color="gray", linewidth=1)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, output / "cplm_overhead.png", dpi=120)
    return ["cplm_overhead.png"]


def _run_row(run: RunRecord, layout: str, efficiency: float) -> list[str]:
    """One row of the runs table."""
    devices = run.layout.world_size
    return [run.preset, "on" if run.copy_head else "off", str(run.nodes), str(devices), layout, str(run.layout.dp),
            str(run.seq_len), str(run.global_batch), f"{run.tokens_per_sec:,.0f}", f"{run.tokens_per_sec / devices:,.0f}",
            f"{run.tflops_per_device:.2f}", f"{100 * run.mfu:.1f}%", f"{run.step_time:.3f}", f"{run.peak_memory_gib:.2f}",
            f"{100 * efficiency:.1f}%", run.config_hash, run.device]


def render_markdown(records: Sequence[Record], series: dict[tuple, list[ScalingPoint]],
                    overheads: Sequence[Overhead], plots: Sequence[str], roots: Sequence[Path]) -> str:
    """The report: runs, scaling efficiency, CPLM overhead, plots."""
    efficiency = {(key, p.nodes, p.world_size): p.efficiency for key, pts in series.items() for p in pts}
    intro = (f"{len(records)} run records from {', '.join(f'`{r}`' for r in roots)}. Scaling efficiency is the "
             "per-device throughput relative to the smallest run of the same model, copy head, layout, "
             "sequence length and global batch (100% = linear scaling).")
    lines = ["# Scaling report", "", intro, "", "## Runs", ""]
    rows = [_run_row(r.run, r.layout, efficiency[(r.series, r.run.nodes, r.run.layout.world_size)]) for r in records]
    lines += table(["model", "copy head", "nodes", "devices", "layout", "dp", "seq", "global batch", "tokens/s",
                     "tokens/s/device", "TFLOP/s/device", "MFU", "step (s)", "peak mem (GiB)", "scaling eff.",
                     "config", "device"], rows)
    lines += ["", "## Scaling efficiency", ""]
    rows = [[series_label(key), str(p.nodes), str(p.world_size), f"{p.tokens_per_sec:,.0f}", str(p.runs),
             f"{100 * p.efficiency:.1f}%"] for key, pts in series.items() for p in pts]
    lines += table(["series", "nodes", "devices", "tokens/s (mean)", "runs", "efficiency"], rows)
    lines += ["", "## Copy-head (CPLM) overhead", ""]
    if overheads:
        rows = [[o.preset, str(o.nodes), o.layout, f"{o.baseline_tokens_per_sec:,.0f}",
                 f"{o.cplm_tokens_per_sec:,.0f}", f"{100 * o.time_overhead:+.1f}%", f"{100 * o.flops_overhead:+.1f}%"]
                for o in overheads]
        lines += table(["model", "nodes", "layout", "tokens/s baseline", "tokens/s CPLM", "time/token overhead",
                         "FLOPs/token overhead"], rows)
    else:
        lines.append("No copy-head on/off pairs of otherwise equal runs: sweep `--copy-head on off` to measure it.")
    lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def write_report(roots: Sequence[Path], output: Path) -> Path:
    """Load the records under `roots`, write report.md and the plots to `output`; returns report.md."""
    records = load_records(roots)
    output.mkdir(parents=True, exist_ok=True)
    series = scaling_series(records)
    overheads = cplm_overheads(records)
    plots = plot_scaling(series, output) + plot_overhead(overheads, output)
    report = output / "report.md"
    report.write_text(render_markdown(records, series, overheads, plots, roots))
    return report
