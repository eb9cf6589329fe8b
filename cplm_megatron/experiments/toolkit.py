"""The report toolkit every experiment report uses (the ablation, the recipe study, the scaling sweep): matplotlib
set up once (Agg, no display), markdown tables, number formats, mean ± std and interval cells, figure grids, bands
over seeds and saving."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

__all__ = ["plt", "table", "fmt", "prob", "pm", "signed_pm", "interval", "grid", "band", "save"]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    """A markdown table's lines; `align` has one letter per column, 'r' right-aligns it (default: all left)."""
    if align and (len(align) != len(header) or set(align) - {"l", "r"}):
        raise ValueError(f"align {align!r} must be one 'l' or 'r' per column ({len(header)} columns)")
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in (align or "l" * len(header))) + "|"
    return ["| " + " | ".join(header) + " |", rule, *("| " + " | ".join(row) + " |" for row in rows)]


def fmt(value: float | None, digits: int = 4) -> str:
    """A number with `digits` decimals ('–' when missing or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def prob(value: float | None) -> str:
    """Probabilities with 3 significant digits (1/V-sized values stay visible)."""
    return "–" if value is None else f"{value:.3g}"


def pm(stats: dict[str, Any], digits: int = 3) -> str:
    """'mean ± std' of a {mean, std} ('–' when missing; no ± for a single value)."""
    if stats.get("mean") is None:
        return "–"
    if stats.get("std") is None:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def signed_pm(stats: dict[str, Any], digits: int = 3) -> str:
    """'+mean ± std (better in k/n)' of a paired difference ('–' when missing)."""
    if stats.get("mean") is None:
        return "–"
    return f"{stats['mean']:+.{digits}f} ± {stats['std'] or 0:.{digits}f} ({stats['better_in']}/{stats['seeds']})"


def interval(stats: dict[str, Any] | None) -> str:
    """'+m [lo, hi]' of a paired t-interval ('–' when missing; says so when < 2 seeds give no interval)."""
    if not stats or stats.get("mean") is None:
        return "–"
    if stats.get("ci_low") is None:
        return f"{stats['mean']:+.3f} (no interval: {stats.get('n', 0)} seed)"
    return f"{stats['mean']:+.3f} [{stats['ci_low']:+.3f}, {stats['ci_high']:+.3f}]"


def grid(n: int, cols: int = 3, size: tuple[float, float] = (4.6, 3.4)):
    """A figure of `n` panels, `cols` per row: (figure, the n axes)."""
    cols = min(cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def band(ax, xs: Sequence[float], per_seed: Sequence[Sequence[float]], color: str, label: str) -> None:
    """The mean over seeds as a line, ± one standard deviation as a band."""
    import numpy as np

    values = np.array(per_seed)
    mean, std = values.mean(axis=0), values.std(axis=0, ddof=1) if len(per_seed) > 1 else 0 * values[0]
    ax.plot(xs, mean, color=color, label=label)
    ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.2)


def save(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, write and close a figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
