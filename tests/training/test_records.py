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
