"""tools/emergence.py end to end at smoke size: the grid's runs with probes, their evaluation, the aggregation, the
gated verdict, the report and its figure; a second invocation reuses every finished run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.mcore, pytest.mark.slow]


def test_smoke_grid_probes_evaluates_and_reports(tmp_path: Path, stdlib_corpus):
    data_root = tmp_path / "data"
    data_root.mkdir()
    (data_root / "code_v4096").symlink_to(stdlib_corpus.root)  # any prepared corpus with train/dev/val will do
    out = tmp_path / "out"
    tool = [sys.executable, str(REPO / "tools/emergence.py"), "--smoke", "--domains", "code", "--output", str(out),
            "--data-root", str(data_root)]
    proc = subprocess.run(tool, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    code = summary["scales"]["code"]
    assert list(code["arms"]) == ["baseline", "aux1"] and code["seeds"] == [1, 2]
    assert set(code["cache_control"]["per_seed"]) == {"1", "2"}
    for name in ("code-baseline-s1", "code-aux1-s2"):
        curve = summary["emergence"][name]["probe_curve"]
        assert [p["iteration"] for p in curve] == [0, 3, 6] and [p["tokens"] for p in curve] == [0, 3072, 6144]
        assert all(0 <= p["copy_accuracy"] <= 1 and p["in_context_score"] is not None for p in curve)
        assert all(p["text_copy_gain"] == pytest.approx(p["text_copy_accuracy"] - p["text_copy_first_accuracy"]) for p in curve)
        found = summary["emergence"][name]
        assert found["copy_accuracy_chance"] == 1 / 4095 and 0 <= found["final_text_copy_accuracy"] <= 1
    verdict = summary["domains"]["code"]
    assert verdict["threshold"] == 0.1 and verdict["baseline_copies"] is False  # 6 steps: nothing copies yet
    assert verdict["verdict"].startswith("not judged") and verdict["credited"] == []
    report = (out / "report.md").read_text()
    assert "## code (hidden 64, 2 layers, V 4096" in report and summary["threshold_rule"] in report
    assert (out / "emergence.png").stat().st_size > 10_000
    again = subprocess.run(tool, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("reused") == 4, again.stdout[-2000:]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path):
    tool = [sys.executable, str(REPO / "tools/emergence.py"), "--output", str(tmp_path)]
    proc = subprocess.run(tool + ["--domains", "poetry"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: unknown arm(s)/domain(s) ['poetry']; arms: baseline, mixture, aux1, aux1+copy, sentinel, "
        "sentinel+aux1, aux0.5, decoupled; domains: code, prose"]
    proc = subprocess.run(tool + ["--seeds", "1,x"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--seeds: expected comma-separated integers" in proc.stderr
    # each was silent: '--domains ,' ran nothing and reported it (exit 0), --jobs 0 trained the grid one run at a
    # time saying '0 at a time', --summarize-only on an empty --output failed on '[Errno 2] ... summary.json.tmp'
    for flags, line in ((["--domains", ","], "error: no domain chosen; domains: code, prose"),
                        (["--jobs", "0"], "error: --jobs must be >= 1, got 0"),
                        (["--summarize-only", "--domains", "code"],
                         f"error: --summarize-only: nothing has run under {tmp_path / 'none'} (no runs/ there); "
                         "check --output")):
        proc = subprocess.run([*tool[:-1], str(tmp_path / "none"), *flags], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [line], proc.stdout + proc.stderr
        assert not (tmp_path / "none").exists()
