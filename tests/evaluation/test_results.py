"""eval.json's one reader: the committed study's files (written before the version was recorded) read as version 1,
one model's results and every checkpoint's alike; another version or a file without results is refused by name."""
from __future__ import annotations

import json

import pytest

from cplm_megatron.evaluation.results import EvalResultsError, read_eval_results, with_version
from tests.harness import REPO


def test_the_committed_study_evaluations_are_read():
    paths = sorted((REPO / "results/study_cpu_v3/runs").glob("*/eval.json"))
    assert paths
    for path in paths:
        results = read_eval_results(path)
        assert results.version == 1 and results.final["iteration"] == 1600 and "val" in results.final["tasks"]


def test_every_checkpoint_sorted_and_bad_files_refused(tmp_path):
    path = tmp_path / "eval.json"
    entries = [{"iteration": 10, "tasks": {}}, {"iteration": 0, "tasks": {}}]
    path.write_text(json.dumps(with_version({"checkpoints": entries})))
    assert [c["iteration"] for c in read_eval_results(path).checkpoints] == [0, 10]
    path.write_text(json.dumps({"version": 2, "checkpoints": entries}))
    with pytest.raises(EvalResultsError, match="eval.json is an evaluation of version 2; this cplm_megatron reads"):
        read_eval_results(path)
    path.write_text(json.dumps({"checkpoints": [{"tasks": {}}]}))
    with pytest.raises(EvalResultsError, match="holds no per-checkpoint results"):
        read_eval_results(path)
    path.write_text("{")
    with pytest.raises(EvalResultsError, match="is not a readable evaluation"):
        read_eval_results(path)
