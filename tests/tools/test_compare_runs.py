"""tools/compare_runs.py on two runs the suite trains: the reference run (10 iterations, validated at 5 and 10) and
the same recipe stopped after 4 (no validation, a stopped-early run record)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cplm_megatron.training.metrics_log import read_metrics
from tests.data_fixtures import load_tool


def run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = load_tool("compare_runs").main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def colour_pixels(png: Path, rgb: tuple[float, float, float]) -> int:
    """Pixels of the PNG within 0.02 of a colour (a drawn curve's)."""
    import matplotlib.image

    image = matplotlib.image.imread(png)[..., :3]
    return int((np.abs(image - np.array(rgb)).max(axis=-1) < 0.02).sum())


def test_compare_two_runs_writes_a_table_and_a_plot(reference_run: dict, stopped_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    ref = reference_run["dir"]
    out = tmp_path / "cmp"
    code, printed, err = run_main(capsys, str(ref), str(stopped_run), "--output", str(out))
    assert code == 0, err
    table = (out / "comparison.md").read_text()
    assert printed.startswith(table.split("\n![")[0].rstrip()) and f"wrote {out / 'comparison.md'}" in printed
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()
            if line.startswith("| ")}
    # both dirs are named run/: the labels take their parents' names
    assert rows[""] == [f"A: {ref.parent.name}/run", f"B: {stopped_run.parent.name}/run |"]
    record = json.loads((ref / "run_record.json").read_text())
    tokens_per_iter = record["global_batch"] * record["seq_len"]
    train = [r for r in read_metrics(ref) if "consumed_tokens" in r]
    val = [r for r in read_metrics(ref) if "val_loss" in r]
    assert [r["iteration"] for r in val] == [5, 10]
    assert rows["final train loss"][0] == f"{reference_run['losses'][10]:.4f} (at {10 * tokens_per_iter:,} tokens)"
    best = min(reference_run["losses"].items(), key=lambda kv: kv[1])
    assert rows["best train loss"][0] == f"{best[1]:.4f} (at {best[0] * tokens_per_iter:,} tokens)"
    best_val = min(val, key=lambda r: r["val_loss"])
    assert rows["best val loss"][0] == f"{best_val['val_loss']:.4f} (at {best_val['iteration'] * tokens_per_iter:,} " \
                                       f"tokens)"
    assert rows["final val loss"] == [f"{val[-1]['val_loss']:.4f} (at {10 * tokens_per_iter:,} tokens)", "– |"]
    assert rows["tokens"] == [f"{train[-1]['consumed_tokens']:,}", f"{4 * tokens_per_iter:,} |"]
    stopped_record = json.loads((stopped_run / "run_record_stopped_early.json").read_text())
    assert rows["tokens/s"][1] == f"{stopped_record['tokens_per_sec']:,.0f} |"
    assert rows["peak memory"][1] == f"{stopped_record['peak_memory_gib']:.2f} GiB (cpu) |"
    assert rows["MFU"][0].endswith("%") and rows["last launch"] == ["finished", "stopped early at iteration 4 |"]
    # the config keys that differ (run.dir always does and is left out)
    assert "| train.exit_after_iters | `null` | `4` |" in table and "| train.eval_interval | `5` | `0` |" in table
    assert "run.dir" not in table.split("## Config keys that differ")[1].replace("(besides run.dir)", "")
    # the plot: a PNG with both runs' curves (A blue, B orange) and A's validation markers
    png = out / "loss_vs_tokens.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![loss vs tokens](loss_vs_tokens.png)" in table
    assert colour_pixels(png, (0.122, 0.467, 0.706)) > 200 and colour_pixels(png, (1.0, 0.498, 0.055)) > 100


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a directory; pass two training run dirs"),
    ("not a run", "has no metrics.jsonl: not a training run dir"),
    ("output is a file", "is a file; name a directory"),
])
def test_bad_input_is_one_line_and_exit_2(stopped_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                          case: str, message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    other = {"missing": tmp_path / "nope", "not a run": tmp_path / "empty"}.get(case, stopped_run)
    output = tmp_path / ("file" if case == "output is a file" else "out")
    code, printed, err = run_main(capsys, str(stopped_run), str(other), "--output", str(output))
    assert code == 2 and printed == "" and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
