"""Records that only grow: a relaunch of a finished run leaves its throughput record as it was (issue 30)."""
import json

import pytest

from tests.trained_runs import REFERENCE_ITERS, copy_run
from tests.training import pretrain_utils as pu

pytestmark = [pytest.mark.mcore, pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


def test_relaunching_a_finished_run_keeps_its_summary(stdlib_corpus, reference_run, tmp_path):
    """A study killed between training and evaluation relaunches the finished run: it trains nothing, exits 0,
    and run_record.json keeps the throughput of the launch that trained (it used to become null)."""
    run_dir = copy_run(reference_run["dir"], tmp_path)
    before = (run_dir / "run_record.json").read_bytes()
    assert json.loads(before)["tokens_per_sec"] > 0
    again = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, REFERENCE_ITERS, **{"train.eval_interval": 5}))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "kept as it was: this launch trained no iteration" in again.stdout
    assert (run_dir / "run_record.json").read_bytes() == before


def test_a_cut_last_metrics_line_is_dropped_on_resume(stdlib_corpus, reference_run, tmp_path):
    """A full disk (or a kill) cut the last line of metrics.jsonl in half: every relaunch used to fail with a
    41-line JSONDecodeError. The cut record is dropped with one line and the run goes on."""
    run_dir = copy_run(reference_run["dir"], tmp_path)
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - 25])  # the last record (iteration 10's validation) cut short
    longer = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, REFERENCE_ITERS + 2, **{"train.eval_interval": 5}))
    assert longer.returncode == 0, longer.stdout[-3000:] + longer.stderr[-3000:]
    cut_line = len(text.splitlines())
    assert (f"[train] {metrics}: dropped its last line (line {cut_line}), cut short by an interrupted write"
            in longer.stdout)
    assert sorted(pu.losses(run_dir)) == list(range(1, REFERENCE_ITERS + 3))
    assert all(json.loads(line) for line in metrics.read_text().splitlines())
