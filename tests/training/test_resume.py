"""What a launch starts from (plan_start) and which config changes a resume accepts (resume_compat):
decided from the files before any process group, nothing written or deleted that the user did not ask for."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import list_checkpoints
from cplm_megatron.errors import CheckpointError, ConfigError
from cplm_megatron.training.resume import apply_plan, plan_start
from cplm_megatron.training.resume_compat import RESUME_CHANGEABLE, compare_configs
from tests.checkpoint.checkpoint_files import (
    COMMON_STATE_GONE,
    copy_run,
    remove_common_state,
    tiny_config,
    write_checkpoints,
)

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("resume") / "run"
    write_checkpoints(tiny_config(run), [2, 4])
    return run


@pytest.fixture
def run(saved_run: Path, tmp_path: Path) -> Path:
    return copy_run(saved_run, tmp_path / "run")


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ resume_compat (no files needed)

def test_architecture_head_loss_and_data_format_must_match(tmp_path: Path) -> None:
    saved = tiny_config(tmp_path).to_dict()
    for override, key in [("copy_head.enabled=false", "copy_head.enabled"), ("model.num_layers=3", "model.num_layers"),
                          ("copy_head.lm_loss_weight=0.5", "copy_head.lm_loss_weight"),
                          ("train.seq_len=16", "train.seq_len"), ("data.document_masking=false", "data.document_masking"),
                          ("optimizer.beta2=0.99", "optimizer.beta2"), ("precision.dtype=bf16", "precision.dtype")]:
        mismatched, _ = compare_configs(saved, tiny_config(tmp_path, override))
        assert [k for k, _, _ in mismatched] == [key], override


def test_schedule_batch_layout_and_logging_may_change(tmp_path: Path) -> None:
    saved = tiny_config(tmp_path).to_dict()
    new = tiny_config(tmp_path / "moved", "train.iters=80", "train.lr=1e-3", "train.global_batch=8",
                      "parallel.tp=2", "schedule.warmup_iters=3", "logging.wandb_project=x", "copy_head.impl=naive",
                      "train.probe_interval=5")
    mismatched, changed = compare_configs(saved, new)
    assert mismatched == []
    assert {k for k, _, _ in changed} == {"run.dir", "train.iters", "train.lr", "train.global_batch", "parallel.tp",
                                         "schedule.warmup_iters", "logging.wandb_project", "copy_head.impl",
                                         "train.probe_interval"}


def test_a_key_missing_from_an_old_saved_config_counts_as_its_default(tmp_path: Path) -> None:
    saved = tiny_config(tmp_path).to_dict()
    del saved["copy_head"]["decouple_lm"]  # as in a checkpoint written before the key existed
    assert compare_configs(saved, tiny_config(tmp_path)) == ([], [])
    mismatched, _ = compare_configs(saved, tiny_config(tmp_path, "copy_head.lm_loss_weight=1",
                                                       "copy_head.decouple_lm=true"))
    assert ("copy_head.decouple_lm", False, True) in mismatched


def test_every_key_outside_the_changeable_lists_must_match(tmp_path: Path) -> None:
    """A key added to any section later is "must match" unless someone lists it: here every key of every
    section that is not listed is changed in the saved config, and each one is reported as a mismatch."""
    cfg = tiny_config(tmp_path)
    saved = cfg.to_dict()
    expected = set()
    for section, values in saved.items():
        for key in values:
            allowed = RESUME_CHANGEABLE.get(section, ())
            if allowed != "*" and key not in allowed:
                values[key] = ["changed"]
                expected.add(f"{section}.{key}")
    mismatched, changed = compare_configs(saved, cfg)
    assert {k for k, _, _ in mismatched} == expected and changed == []


def test_weights_only_loads_compare_only_the_tensors(tmp_path: Path) -> None:
    saved = tiny_config(tmp_path).to_dict()
    finetune = tiny_config(tmp_path, "model.rope_theta=50000", "train.seq_len=16", "copy_head.lm_loss_weight=1",
                           "optimizer.beta2=0.99", "precision.dtype=bf16")
    assert compare_configs(saved, finetune, weights_only=True)[0] == []
    mismatched, _ = compare_configs(saved, tiny_config(tmp_path, "model.hidden_size=128"), weights_only=True)
    assert [k for k, _, _ in mismatched] == ["model.hidden_size"]


# ------------------------------------------------------------------ plan_start on real checkpoint files

def test_resume_plan_reports_changed_settings(saved_run: Path, run: Path) -> None:
    plan = plan_start(tiny_config(run, "train.iters=80"))
    assert plan.resumed and plan.checkpoint.iteration == 4 and plan.load_optimizer and not plan.delete_existing
    # (this copy of the run lives in another directory: run.dir changed too)
    assert plan.notes == [f"[train] changed since iter_0000004: run.dir: {str(saved_run)!r} -> {str(run)!r}, "
                          f"train.iters: 40 -> 80"]


def test_changed_model_is_refused_naming_the_keys(run: Path) -> None:
    """A change of the model's tensors cannot resume and no checkpoint.load can take it: the fix is a new run dir
    from scratch; a change that keeps the tensors (the loss's weights) may start from these weights instead."""
    before = snapshot(run)
    with pytest.raises(ConfigError, match=r"cannot resume from \S+iter_0000004: settings that define the model, its "
                                          r"loss or its data differ from the checkpoint's saved config \(model.num_layers: "
                                          r"2 -> 4, copy_head.enabled: True -> False\); restore them, or train this model "
                                          r"from scratch in a new run dir \(--set run.dir=NEW_DIR\): its tensors differ "
                                          r"from the checkpoint's \(model.num_layers: 2 -> 4, copy_head.enabled: True -> "
                                          r"False\), so no checkpoint.load can take them$"):
        plan_start(tiny_config(run, "copy_head.enabled=false", "model.num_layers=4"))
    with pytest.raises(ConfigError, match=r"\(copy_head.lm_loss_weight: 1.0 -> 0.5\); restore them, or start a new run "
                                          r"from these weights with --set run.dir=NEW_DIR checkpoint.load=\S+iter_0000004 "
                                          r"checkpoint.load_optimizer=false$"):
        plan_start(tiny_config(run, "copy_head.lm_loss_weight=0.5"))
    assert snapshot(run) == before


def test_resume_false_on_a_run_with_checkpoints_is_refused_unless_overwrite(run: Path) -> None:
    with pytest.raises(CheckpointError, match=r"checkpoint.resume=false but \S+/checkpoints holds checkpoints of an "
                                              r"earlier run; .*--set checkpoint.overwrite=true$"):
        plan_start(tiny_config(run, "checkpoint.resume=false"))
    (run / "checkpoints" / "latest").unlink()  # a `latest`-less run dir is still a run with checkpoints
    with pytest.raises(CheckpointError, match="checkpoint.resume=false"):
        plan_start(tiny_config(run, "checkpoint.resume=false"))
    plan = plan_start(tiny_config(run, "checkpoint.resume=false", "checkpoint.overwrite=true"))
    assert plan.checkpoint is None and plan.delete_existing
    with pytest.raises(ConfigError, match="checkpoint.overwrite=true .* needs checkpoint.resume=false"):
        tiny_config(run, "checkpoint.overwrite=true")


def test_fresh_start_only_without_checkpoints(tmp_path: Path, run: Path) -> None:
    assert plan_start(tiny_config(tmp_path / "new")).checkpoint is None
    (run / "checkpoints" / "latest").unlink()
    for it in ("iter_0000002", "iter_0000004"):  # unfinished saves only: nothing to resume, nothing to protect
        (run / "checkpoints" / it / "cplm_state.json").unlink()
    plan = plan_start(tiny_config(run, "checkpoint.resume=false"))
    assert plan.checkpoint is None and not plan.delete_existing


def test_latest_moved_back_by_a_person_is_honoured_and_the_newer_checkpoints_kept_aside(run: Path) -> None:
    """The trainer's record (latest.trainer = iter_0000004) tells a person's rollback from a crash."""
    root = run / "checkpoints"
    assert (root / "latest.trainer").read_text() == "iter_0000004\n"
    (root / "latest").write_text("iter_0000002\n")
    before = snapshot(run)
    plan = plan_start(tiny_config(run))
    assert plan.checkpoint.iteration == 2 and plan.set_aside == [root / "iter_0000004"]
    assert "was moved back to iter_0000002 (the trainer last set it to iter_0000004)" in plan.notes[0]
    assert snapshot(run) == before  # deciding writes nothing
    apply_plan(plan, root)  # what the trainer does once every check passed
    [aside] = root.glob("set_aside_*")
    assert [p.name for p in list_checkpoints(root)] == ["iter_0000002"]
    moved = {k.replace(f"checkpoints/{aside.name}/", "checkpoints/"): v for k, v in snapshot(run).items()}
    assert moved == before  # renamed, byte for byte: nothing deleted


def test_a_checkpoint_committed_before_latest_moved_is_resumed(run: Path) -> None:
    """A crash after iter_0000004 committed but before `latest` (and latest.trainer) moved from iter_0000002."""
    root = run / "checkpoints"
    for name in ("latest", "latest.trainer"):
        (root / name).write_text("iter_0000002\n")
    plan = plan_start(tiny_config(run))
    assert plan.checkpoint.iteration == 4 and not plan.set_aside
    assert plan.notes[0] == (f"[checkpoint] iter_0000004 is complete but newer than {root}/latest (iter_0000002): "
                             "the run stopped before moving latest; resuming from iter_0000004")


def test_without_the_trainers_record_a_latest_behind_intact_checkpoints_is_refused(run: Path) -> None:
    (run / "checkpoints" / "latest.trainer").unlink()  # a run saved before the record existed
    (run / "checkpoints" / "latest").write_text("iter_0000002\n")
    with pytest.raises(CheckpointError, match=r"latest points at iter_0000002, but newer complete checkpoints exist "
                                              r"\(iter_0000004\) and no latest.trainer record says who moved latest, "
                                              r"so this run would replace them; continue from the "
                                              r"newest with: echo iter_0000004 > \S+latest, or move iter_0000004 out"):
        plan_start(tiny_config(run))


def test_latest_moved_back_past_a_damaged_checkpoint_resumes_and_keeps_it_aside(run: Path) -> None:
    remove_common_state(run / "checkpoints" / "iter_0000004")
    with pytest.raises(CheckpointError, match=rf"iter_0000004 is damaged: {COMMON_STATE_GONE}.*echo iter_0000002"):
        plan_start(tiny_config(run))
    (run / "checkpoints" / "latest").write_text("iter_0000002\n")  # the fix the message names
    plan = plan_start(tiny_config(run))
    assert plan.checkpoint.iteration == 2 and plan.set_aside == [run / "checkpoints" / "iter_0000004"]


def test_a_fix_never_suggests_deleting_while_a_complete_checkpoint_exists(run: Path) -> None:
    """Only a newer checkpoint is complete: the fix points latest at it instead of suggesting a fresh start."""
    root = run / "checkpoints"
    remove_common_state(root / "iter_0000002")
    (root / "latest").write_text("iter_0000002\n")
    with pytest.raises(CheckpointError) as refused:
        plan_start(tiny_config(run))
    assert f"echo iter_0000004 > {root}/latest" in str(refused.value) and "overwrite" not in str(refused.value)


def test_load_from_another_run(run: Path, tmp_path: Path) -> None:
    new = tmp_path / "finetune"
    plan = plan_start(tiny_config(new, f"checkpoint.load={run}", "checkpoint.load_optimizer=false",
                                  "model.rope_theta=50000", "train.seq_len=16"))
    assert plan.checkpoint.path == run / "checkpoints" / "iter_0000004" and not plan.resumed
    assert not plan.load_optimizer
    assert plan.notes == ["[train] changed since iter_0000004: model.rope_theta: 10000.0 -> 50000.0"]
    with pytest.raises(ConfigError, match=r"cannot start from \S+iter_0000004: .*\(model.hidden_size: 64 -> 128\)"):
        plan_start(tiny_config(new, f"checkpoint.load={run}", "checkpoint.load_optimizer=false",
                               "model.hidden_size=128"))
    with pytest.raises(ConfigError, match=r"train.seq_len: 32 -> 16"):  # with the optimizer: a continued run
        plan_start(tiny_config(new, f"checkpoint.load={run}", "train.seq_len=16"))
