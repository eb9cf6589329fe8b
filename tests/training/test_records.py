"""Records that only grow: a relaunch of a finished run leaves its throughput record as it was (issue 30)."""
import json
from pathlib import Path

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


def test_a_disk_filled_during_an_async_save_resumes_once_space_is_freed(tmp_path, mounts):
    """A filesystem of 2.5 checkpoints (the planner's size: what the launch checks) holds two checkpoints, not the
    third written beside them in the background: the run stops with one line saying the disk is full, no record is
    left half written, and once the filesystem is grown the same command resumes from the last complete checkpoint
    and finishes."""
    from cplm_megatron.checkpoint.lookup import iteration_of
    from cplm_megatron.run_config import load_run_config
    from cplm_megatron.training.preflight import checkpoint_size
    from tests import harness

    disk = tmp_path / "disk"
    run_dir = disk / "run"
    overrides = [f"run.dir={run_dir}", "data.synthetic=copy", "model.vocab_size=256", "train.seq_len=64",
                 "train.micro_batch=2", "train.global_batch=2", "train.iters=10", "train.log_interval=1",
                 "train.eval_interval=0", "checkpoint.interval=2", "checkpoint.async_save=true", "logging.wandb=false"]
    size = checkpoint_size(load_run_config(str(harness.TINY_RECIPE), overrides))
    mounts.tmpfs(disk, f"{int(2.5 * size) >> 10}k")
    full = harness.run_pretrain(1, overrides, script=mounts.script(harness.PRETRAIN))
    seen = mounts.seen(run_dir)
    errors = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert full.returncode == 2 and len(errors) == 1, full.stdout[-3000:] + full.stderr[-3000:]
    assert "saving a checkpoint in" in errors[0] and "the disk is full" in errors[0], errors
    assert "Traceback" not in full.stderr, full.stderr[-3000:]
    latest = (seen / "checkpoints" / "latest").read_text().strip()
    assert 2 <= iteration_of(Path(latest)) < 10, latest
    lines = (seen / "metrics.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line) for line in lines)  # whole records only
    mounts.resize(disk, f"{int(6 * size) >> 10}k")  # space freed: room for two more beside what is there
    again = harness.run_pretrain(1, overrides, script=mounts.script(harness.PRETRAIN))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resumed from {run_dir}/checkpoints/{latest} at iteration {iteration_of(Path(latest))}" in again.stdout
    assert sorted(pu.losses(seen)) == list(range(1, 11))
    assert (seen / "checkpoints" / "latest").read_text().strip() == "iter_0000010"
