"""The run record (training/run_record.py): written and read back as the dataclass, found under its legacy name
(summary.json, runs trained before the rename), and refused with the file named when unknown or incomplete."""
from __future__ import annotations

import json

import pytest

from cplm_megatron.training.run_record import (
    Layout,
    RunRecord,
    RunRecordError,
    has_run_record,
    read_run_record,
    write_run_record,
)
from tests.harness import REPO


def _record(stopped_early: bool = False) -> RunRecord:
    return RunRecord("tiny", True, Layout(1, 1, 1, None, False, 1), 1, "cpu", 256, 8, 20, 6958.1, 0.03, 0.03, 0.29,
                     0.64, 4718976.0, "0731286722ba", stopped_early)


def test_written_read_back_and_stopped_early_apart(tmp_path):
    assert not has_run_record(tmp_path)
    write_run_record(tmp_path, _record(stopped_early=True))
    assert not has_run_record(tmp_path)  # a launch stopped early is not a finished run
    path = write_run_record(tmp_path, _record())
    assert path.name == "run_record.json" and has_run_record(tmp_path)
    assert read_run_record(tmp_path) == read_run_record(path) == _record()
    assert json.loads(path.read_text())["version"] == 1


def test_the_committed_study_runs_legacy_records_are_read():
    runs = sorted((REPO / "results/study_cpu_v3/runs").iterdir())
    assert runs
    for run_dir in runs:
        record = read_run_record(run_dir)  # summary.json: written before the rename
        assert record.iterations == 1600 and record.layout.world_size == 1 and record.version == 1


def test_unknown_versions_and_incomplete_records_are_refused(tmp_path):
    path = write_run_record(tmp_path, _record())
    path.write_text(json.dumps({**_record().to_json(), "version": 2}))
    with pytest.raises(RunRecordError, match="run_record.json is a run record of version 2; this cplm_megatron reads"):
        read_run_record(tmp_path)
    data = _record().to_json()
    del data["config_hash"]
    path.write_text(json.dumps(data))
    with pytest.raises(RunRecordError, match="missing"):
        read_run_record(tmp_path)
    with pytest.raises(RunRecordError, match="has no run_record.json .* did not finish"):
        read_run_record(tmp_path / "nothing")
