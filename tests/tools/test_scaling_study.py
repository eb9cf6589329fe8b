"""tools/scaling_study.py (cplm_megatron/experiments/scaling/plan.py, sweep.py): layouts, the study grid and the sbatch
commands (no submission)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import REPO
from tools.scaling_study import (
    Combination,
    StudyError,
    SweepLayout,
    main,
    parse_args,
    plan,
    recipe_layout,
    sbatch_command,
)


def test_layout_names_round_trip_and_bad_ones_are_rejected():
    assert SweepLayout.parse("tp4pp2vpp4sp") == SweepLayout(4, 2, 4, True)
    assert SweepLayout.parse("tp2pp1sp").overrides() == ["parallel.tp=2", "parallel.pp=1", "parallel.vpp=null",
                                                    "parallel.sp=true"]
    for text in ("tp4pp2vpp4sp", "tp1pp1", "tp2pp2vpp2"):
        assert SweepLayout.parse(text).name == text
    for bad in ("tp2", "tp1pp1sp", "tp2pp1vpp2", "tp0pp1"):
        with pytest.raises(StudyError, match=bad):
            SweepLayout.parse(bad)


def test_grid_skips_layouts_the_world_cannot_hold():
    layouts = {"1p7b": [SweepLayout(1, 1, None, False), SweepLayout(4, 4, None, False)]}
    runnable, skipped = plan(layouts, [1, 2], [True, False], tasks_per_node=8)
    assert [c.name for c in runnable] == ["1p7b-n1-tp1pp1-cplm", "1p7b-n1-tp1pp1-base", "1p7b-n2-tp1pp1-cplm",
                                          "1p7b-n2-tp4pp4-cplm", "1p7b-n2-tp1pp1-base", "1p7b-n2-tp4pp4-base"]
    assert [(c.name, why) for c, why in skipped] == [
        ("1p7b-n1-tp4pp4-cplm", "world size 8 is not divisible by tp*pp=16"),
        ("1p7b-n1-tp4pp4-base", "world size 8 is not divisible by tp*pp=16")]


def test_recipe_layouts_come_from_the_scripts_recipes():
    assert recipe_layout("13b") == SweepLayout(4, 2, 4, True)
    assert recipe_layout("135m") == SweepLayout(1, 1, None, False)


def test_sbatch_command_runs_the_size_script_with_the_study_overrides_then_the_users(tmp_path: Path):
    args = parse_args(["--output", str(tmp_path), "--sizes", "7b", "--nodes", "2", "--iters", "7",
                       "--ntasks-per-node", "2", "--sbatch-arg=--partition=h100", "--set", "train.lr=1e-4"])
    combo = Combination("7b", 2, SweepLayout(2, 1, None, True), False)
    cmd = sbatch_command(combo, tmp_path, args, dependency="41")
    script_path = combo.script(REPO / "slurm")
    script = cmd.index(str(script_path))
    assert script_path.is_file() and script_path.name == "pretrain_7b.sh"
    assert set(cmd[1:script]) == {"--parsable", "--job-name=scal-7b-n2-tp2pp1sp-base", "--nodes=2", "--time=00:30:00",
                                  f"--output={tmp_path}/logs/%x-%j.out", "--ntasks-per-node=2", "--exclusive",
                                  "--dependency=afterany:41", "--partition=h100"}
    assert cmd[script + 1:] == [
        "--set", f"run.dir={tmp_path}/runs/7b-n2-tp2pp1sp-base", "copy_head.enabled=false", "parallel.tp=2",
        "parallel.pp=1", "parallel.vpp=null", "parallel.sp=true", "train.tokens=null", "train.iters=7",
        "train.eval_interval=0", "checkpoint.interval=0", "train.lr=1e-4"]


def test_dry_run_prints_commands_and_skips_runs_with_records(tmp_path: Path, capsys):
    done = tmp_path / "runs" / "135m-n1-tp1pp1-cplm"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    assert main(["--output", str(tmp_path), "--sizes", "135m", "--nodes", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "135m-n1-tp1pp1-cplm: record exists, not resubmitted" in out
    assert "--job-name=scal-135m-n1-tp1pp1-base" in out and "slurm/pretrain_135m.sh" in out
    assert not (tmp_path / "study.json").exists()
