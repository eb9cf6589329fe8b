"""Job records: the committed CPU study's runs (job.json written by the command-line launcher before the typed
runs) are migrated when read, match the runs the study plans now and are reused; the study's summary comes out
byte for byte as committed; an ablation's torchrun record migrates too; an unknown version is refused."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cplm_megatron.experiments.ablation.plan import AblationSettings, ablation_runs
from cplm_megatron.experiments.launch.launcher import Launcher
from cplm_megatron.experiments.records import RecordError, read_job_record, read_study_summary
from cplm_megatron.experiments.study.plan import StudySettings, corpus_dirs, study_runs
from tests.data_fixtures import synthetic_tokenizer, write_synthetic_dataset
from tests.harness import REPO

STUDY = REPO / "results" / "study_cpu_v3"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root whose stdlib/train has the study's vocabulary and length (all the plan reads of it)."""
    root = tmp_path_factory.mktemp("data")
    docs = [list(range(1 + i, 300 + i)) for i in range(4)]
    write_synthetic_dataset(root / "stdlib" / "train", docs, seq_len=256, tokenizer=synthetic_tokenizer(4096))
    return root


@pytest.fixture
def study_copy(tmp_path) -> Path:
    """The committed study's runs, copied (the tests never write into benchmarks/)."""
    shutil.copytree(STUDY / "runs", tmp_path / "study" / "runs")
    for spamlang in STUDY.glob("spamlang_h*"):  # SpamLang's records: a summary that runs no SpamLang keeps its claims
        shutil.copytree(spamlang, tmp_path / "study" / spamlang.name)
    return tmp_path / "study"


def test_the_committed_study_runs_are_migrated_and_reused(data_root, study_copy):
    planned = {run.name: run for run in study_runs(StudySettings(), corpus_dirs(StudySettings(), data_root))}
    launcher = Launcher(study_copy, data_root)
    names = sorted(p.name for p in (study_copy / "runs").iterdir())
    assert len(names) >= 14
    for name in names:
        path = study_copy / "runs" / name / "job.json"
        assert "version" not in json.loads(path.read_text())  # written by the old launcher
        record = read_job_record(path)
        assert record == launcher.record(planned[name]), name
        result = launcher.run_job(planned[name])
        assert result.reused and result.error is None, result.error
    moved = Launcher(study_copy, data_root.parent)  # the data elsewhere: the runs are not this plan's
    assert not moved.is_finished(planned[names[0]])


def test_the_committed_study_summary_and_report_come_out_byte_for_byte(data_root, study_copy):
    from cplm_megatron.experiments.study.pipeline import write_study_summary
    from cplm_megatron.experiments.study.report import write_study_report

    committed = (STUDY / "summary.json").read_text()
    old = json.loads(committed)
    assert committed == json.dumps(old, indent=2) + "\n"  # so comparing the parsed bodies compares the bytes
    runs = study_runs(StudySettings(), corpus_dirs(StudySettings(), data_root))
    outcome = write_study_summary(study_copy, StudySettings(), data_root, runs, None, 1, 1, old["command"], None,
                                  lambda _: None, 0.0)
    summary = read_study_summary(outcome.summary_json)
    assert summary["seconds_this_invocation"] > 0 and next(iter(summary)) == "version"
    summary["seconds_this_invocation"] = old["seconds_this_invocation"]  # the wall time of that invocation
    # the one difference: the summary now starts with "version": 1 (a summary written before has none)
    assert json.dumps({k: v for k, v in summary.items() if k != "version"}, indent=2) == \
        json.dumps({k: v for k, v in old.items() if k != "version"}, indent=2)
    # the report toolkit changed nothing (the report states the invocation's minutes: given the committed one's)
    assert write_study_report(study_copy, summary, summary["spamlang"]).read_text() == (STUDY / "report.md").read_text()


def test_an_ablation_torchrun_record_migrates(tmp_path):
    """A version-1 record of a TP=2 ablation run (torchrun, every checkpoint evaluated) is the same run launched
    with 2 processes now, and differs from it launched with one."""
    run = ablation_runs(AblationSettings(experiments=("spamlang",), spamlang_vocabs=(4096,), spamlang_ties=(False,)),
                        None)[1]
    sets = [f"run.dir={{output}}/runs/{run.name}", *run.overrides(), "parallel.tp=2"]
    v1 = {"train": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    "{repo}/pretrain/pretrain_cplm.py", "--config", "{repo}/configs/tiny.yaml", "--set", *sets],
          "eval": ["{repo}/tools/evaluate.py", "--checkpoint", f"{{output}}/runs/{run.name}", "--all-checkpoints",
                   "--include-initial", "--no-progress", "--output", f"{{output}}/runs/{run.name}/eval.json",
                   "--tasks", "spamlang,gradient", "--limit", "32", "--gradient-source", "spamlang",
                   "--spamlang-length", "128"]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(v1))
    record = read_job_record(path)
    assert record.processes == 2 and record.recipe == "tiny"
    assert record == Launcher(tmp_path, processes=2).record(run)
    assert record != Launcher(tmp_path).record(run)
    path.write_text(json.dumps({**v1, "eval": [*v1["eval"], "--bogus"]}))
    with pytest.raises(ValueError, match="a job record this version can migrate \\(evaluation option '--bogus'\\)"):
        read_job_record(path)


def test_study_summaries_are_read_by_version(tmp_path):
    assert read_study_summary(STUDY / "summary.json")["decision"]["default"]  # written before the version: 1
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({**json.loads((STUDY / "summary.json").read_text()), "version": 2}))
    with pytest.raises(RecordError, match="summary.json is a study summary of version 2; this cplm_megatron reads"):
        read_study_summary(path)
    path.write_text(json.dumps({"preset": "tiny", "iterations": 20}))  # a run's record under the old name
    with pytest.raises(RecordError, match="is not a study's summary .* run_record.json"):
        read_study_summary(path)
