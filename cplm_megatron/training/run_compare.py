"""Two training runs side by side, without TensorBoard (tools/compare_runs.py): a table of their final and best
training and validation loss, tokens, throughput, MFU and peak memory, the config keys that differ, and a plot of
loss against tokens (training and validation, both runs).

Each run is read through its own readers: metrics.jsonl (`metrics_log.read_metrics`, the loss of the model's output
distribution: `record_nll`), the run record (`run_record`: throughput, MFU, peak memory of the last launch) and the
resolved config.yaml the trainer wrote."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cplm_megatron.config.loader import read_yaml
from cplm_megatron.errors import UserError
from cplm_megatron.training.metrics_log import METRICS_FILE, read_metrics, record_nll
from cplm_megatron.training.run_record import (
    RunRecord,
    read_run_record,
    run_record_path,
)

CONFIG_FILE = "config.yaml"  # the resolved config the trainer writes into the run dir
TABLE_NAME = "comparison.md"
PLOT_NAME = "loss_vs_tokens.png"
NOT_COMPARED = ("run.dir",)  # differs between any two runs


class RunCompareError(UserError):
    """A run dir that cannot be compared; names the path and the fix."""


@dataclass(frozen=True)
class RunCurves:
    """One run as the comparison sees it: loss against tokens, its launch record and its flattened config."""

    name: str
    path: Path
    train: list[tuple[int, float]]  # (tokens consumed, training NLL) per logged iteration
    val: list[tuple[int, float]]  # (tokens consumed, validation loss) per validation
    record: RunRecord | None  # the last launch's record (None: the run has none yet)
    config: dict[str, Any]  # dotted key -> value


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def read_run(path: Path, name: str | None = None) -> RunCurves:
    """A run dir's curves, record and config; RunCompareError when it is not a run dir with logged iterations."""
    path = Path(path)
    if not path.is_dir():
        raise RunCompareError(f"{path} is not a directory; pass two training run dirs (run.dir of each run)")
    if not (path / METRICS_FILE).is_file():
        raise RunCompareError(f"{path} has no {METRICS_FILE}: not a training run dir (run.dir), or it logged nothing "
                              f"yet")
    config = flatten(read_yaml(path / CONFIG_FILE)) if (path / CONFIG_FILE).is_file() else {}
    tokens_per_iter = int(config.get("train.global_batch", 0)) * int(config.get("train.seq_len", 0))
    records = read_metrics(path)
    tokens_at = {r["iteration"]: r["consumed_tokens"] for r in records if "consumed_tokens" in r}
    train = [(r["consumed_tokens"], record_nll(r)) for r in records if "consumed_tokens" in r and "loss" in r]
    val = [(tokens_at.get(r["iteration"], r["iteration"] * tokens_per_iter), r["val_loss"])
           for r in records if "val_loss" in r]
    if not train:
        raise RunCompareError(f"{path / METRICS_FILE} holds no training records yet; compare once the run has logged")
    found = run_record_path(path) or run_record_path(path, stopped_early=True)
    record = read_run_record(found) if found else None
    return RunCurves(name or path.name, path, train, val, record, config)


def config_differences(a: RunCurves, b: RunCurves) -> list[tuple[str, Any, Any]]:
    """(dotted key, A's value, B's value) of every config key whose values differ (a key one lacks: None)."""
    keys = sorted(set(a.config) | set(b.config))
    return [(k, a.config.get(k), b.config.get(k)) for k in keys
            if k not in NOT_COMPARED and a.config.get(k) != b.config.get(k)]


def _loss(points: list[tuple[int, float]], best: bool) -> str:
    if not points:
        return "–"
    tokens, value = min(points, key=lambda p: p[1]) if best else points[-1]
    return f"{value:.4f} (at {tokens:,} tokens)"


def _record_cell(record: RunRecord | None, field: str) -> str:
    value = getattr(record, field, None) if record is not None else None
    if value is None:
        return "–"
    if field == "mfu":
        return f"{100 * value:.2f}%"
    if field == "peak_memory_gib":
        return f"{value:.2f} GiB ({record.device})"
    return f"{value:,.0f}"


def summary_rows(a: RunCurves, b: RunCurves) -> list[tuple[str, str, str]]:
    """(what, run A, run B) rows of the comparison table."""
    rows = [
        ("final train loss", _loss(a.train, False), _loss(b.train, False)),
        ("best train loss", _loss(a.train, True), _loss(b.train, True)),
        ("final val loss", _loss(a.val, False), _loss(b.val, False)),
        ("best val loss", _loss(a.val, True), _loss(b.val, True)),
        ("tokens", f"{a.train[-1][0]:,}", f"{b.train[-1][0]:,}"),
    ]
    rows += [(label, _record_cell(a.record, field), _record_cell(b.record, field))
             for label, field in (("tokens/s", "tokens_per_sec"), ("MFU", "mfu"), ("peak memory", "peak_memory_gib"))]
    return rows + [("last launch", _status(a.record), _status(b.record))]


def _status(record: RunRecord | None) -> str:
    if record is None:
        return "no run record (still training, or killed)"
    return f"stopped early at iteration {record.iterations:,}" if record.stopped_early else "finished"


def _cell(value: Any) -> str:
    """A config value as the YAML of a `--set` override writes it (null, true, 3e-4, [a, b])."""
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def comparison_markdown(a: RunCurves, b: RunCurves, plot: str | None = PLOT_NAME) -> str:
    """The comparison as markdown: the summary table, the differing config keys and the plot."""
    lines = [f"# {a.name} vs {b.name}", "", f"- A: `{a.path}`", f"- B: `{b.path}`", "",
             f"| | A: {a.name} | B: {b.name} |", "|---|---|---|"]
    lines += [f"| {what} | {x} | {y} |" for what, x, y in summary_rows(a, b)]
    lines.append("\nLoss is the NLL of the model's output distribution (the mixture's for a CPLM); throughput, MFU "
                 "and peak memory are of each run's last launch (its run record; `–`: none yet).")
    diffs = config_differences(a, b)
    lines += ["", "## Config keys that differ", ""]
    if diffs:
        lines += ["| key | A | B |", "|---|---|---|"] + [f"| {k} | {_cell(x)} | {_cell(y)} |" for k, x, y in diffs]
    else:
        lines.append("None (besides run.dir)." if a.config and b.config else "Not known: a run has no config.yaml.")
    if plot:
        lines += ["", f"![loss vs tokens]({plot})"]
    return "\n".join(lines) + "\n"


def plot_losses(a: RunCurves, b: RunCurves, path: Path) -> Path:
    """Training (line) and validation (dashed, markers) loss against tokens, both runs, into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for run, color in ((a, "tab:blue"), (b, "tab:orange")):
        ax.plot(*zip(*run.train), color=color, linewidth=1.2, label=f"{run.name} train")
        if run.val:
            ax.plot(*zip(*run.val), color=color, linestyle="--", marker="o", markersize=4, label=f"{run.name} val")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(f"{a.name} vs {b.name}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_runs(run_a: Path, run_b: Path, output: Path) -> tuple[str, Path, Path]:
    """Read both runs, write OUTPUT/comparison.md and OUTPUT/loss_vs_tokens.png; (markdown, table, plot)."""
    names = (Path(run_a).name, Path(run_b).name)
    if names[0] == names[1]:  # e.g. two runs/<x>/run dirs: name them by their parent too
        names = tuple(f"{Path(p).parent.name}/{Path(p).name}" for p in (run_a, run_b))
    a, b = read_run(run_a, names[0]), read_run(run_b, names[1])
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise RunCompareError(f"--output {output} is a file; name a directory for {TABLE_NAME} and {PLOT_NAME}")
    output.mkdir(parents=True, exist_ok=True)
    plot = plot_losses(a, b, output / PLOT_NAME)
    markdown = comparison_markdown(a, b)
    table = output / TABLE_NAME
    table.write_text(markdown)
    return markdown, table, plot
