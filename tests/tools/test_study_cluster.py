"""tools/study_cluster.py without a cluster: the plan and its sbatch command lines (--dry-run), the GPU-hours
estimate, and refusals (the SLURM run itself: tests/slurm/test_study_cluster.py)."""
import pytest

from tests.data_fixtures import load_tool


def test_dry_run_prints_two_jobs_per_run_and_the_gpu_hours(stdlib_corpus, tmp_path, capsys):
    tool = load_tool("study_cluster")
    code = tool.main(["submit", "--output", str(tmp_path / "study"), "--data", str(stdlib_corpus.root),
                      "--scales", "135m", "--arms", "baseline,aux1", "--seeds", "1,2", "--iters", "1000",
                      "--sbatch-arg=--partition=h100", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("sbatch ")]
    assert len(lines) == 8  # 4 runs x (training, evaluation)
    train, evaluate = lines[0], lines[1]
    assert "slurm/pretrain_135m.sh" in train and "--partition=h100" in train and "copy_head.enabled=false" in train
    assert "--dependency=afterok:TRAIN_JOB_ID" in evaluate and "-m cplm_megatron.evaluate" in evaluate and "--gpus=1" in evaluate
    assert "cache" in evaluate  # the baseline's continuous-cache control
    # SmolLM2-135M, 1000 steps of the recipe's batch: a few GPU-hours at the assumed MFU, not zero
    hours = float(out.split("~")[1].split(" GPU-hours")[0])
    assert 0.5 < hours < 200
    assert not (tmp_path / "study" / "study.json").exists()  # a dry run writes nothing


def test_bad_studies_are_refused_with_exit_2(tmp_path, capsys, stdlib_corpus):
    tool = load_tool("study_cluster")
    base = ["submit", "--output", str(tmp_path / "s")]
    assert tool.main([*base, "--data", str(tmp_path)]) == 2
    assert "no prepared train, dev, val split(s)" in capsys.readouterr().err
    assert tool.main([*base, "--data", str(stdlib_corpus.root), "--seeds", "1"]) == 2
    assert ">= 2 distinct seeds" in capsys.readouterr().err
    assert tool.main([*base, "--data", str(stdlib_corpus.root), "--arms", "mixture,aux1"]) == 2
    assert tool.main(["collect", "--output", str(tmp_path / "none")]) == 2
    assert "submit the study first" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main([*base, "--data", str(stdlib_corpus.root), "--scales", "7b", "--bogus"])
