"""The one checkpoint lookup (training resume, evaluation, conversion): path forms, a missing `latest`,
and every kind of damage named with the checkpoint, what is missing and the fix."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import (
    CheckpointRecord,
    all_checkpoints,
    checkpoint_files,
    content_damage,
    damaged_contents_message,
    find_checkpoint,
    is_intact,
    list_checkpoints,
    read_latest,
    read_record,
    resolve_checkpoint,
)
from cplm_megatron.errors import CheckpointError
from tests.checkpoint.checkpoint_files import (
    COMMON_STATE_GONE,
    copy_run,
    remove_common_state,
    shards,
    tiny_config,
    write_checkpoints,
)

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with committed checkpoints at iterations 1, 2, 3 (`latest` -> iter_0000003)."""
    run = tmp_path_factory.mktemp("lookup") / "run"
    write_checkpoints(tiny_config(run), [1, 2, 3])
    return run


@pytest.fixture
def run(saved_run: Path, tmp_path: Path) -> Path:
    return copy_run(saved_run, tmp_path / "run")


def test_path_forms_resolve_to_the_latest_checkpoint(saved_run: Path) -> None:
    root = saved_run / "checkpoints"
    latest = root / "iter_0000003"
    assert read_latest(root) == latest
    assert resolve_checkpoint(saved_run).path == latest and resolve_checkpoint(saved_run).iteration == 3
    assert resolve_checkpoint(root).path == latest
    assert resolve_checkpoint(root / "iter_0000001").iteration == 1
    assert [r.iteration for r in all_checkpoints(saved_run)] == [1, 2, 3]


def test_no_checkpoint_is_none_for_training_and_an_error_for_readers(tmp_path: Path) -> None:
    assert find_checkpoint(tmp_path / "checkpoints") is None
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no complete checkpoint under"):
        all_checkpoints(tmp_path)


def test_missing_latest_means_the_newest_complete_checkpoint_said_out_loud(run: Path) -> None:
    (run / "checkpoints" / "latest").unlink()
    said: list[str] = []
    assert find_checkpoint(run / "checkpoints", say=said.append).path.name == "iter_0000003"
    assert said == [f"[checkpoint] {run}/checkpoints/latest is missing: using the newest complete checkpoint "
                    f"iter_0000003"]


def test_training_evaluation_and_conversion_agree_without_latest(run: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The trainer's resume plan, tools/evaluate.py's scorer and tools/convert_to_hf.py's reader use the same
    lookup: all pick iter_0000003 (and say so) when `latest` is gone."""
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron
    from cplm_megatron.hf.megatron_checkpoint import open_checkpoint
    from cplm_megatron.training.resume import plan_start

    (run / "checkpoints" / "latest").unlink()
    newest = run / "checkpoints" / "iter_0000003"
    plan = plan_start(tiny_config(run))
    assert plan.checkpoint.path == newest and plan.resumed and "latest is missing" in plan.notes[0]
    with caplog.at_level(logging.WARNING):
        assert open_checkpoint(run).path == newest
        with single_process_megatron():
            assert MegatronScorer.load(run).checkpoint.path == newest
    assert caplog.text.count("latest is missing: using the newest complete checkpoint iter_0000003") == 2


FIX = r"point latest at the previous complete checkpoint: echo iter_0000002 > \S+/checkpoints/latest"


@pytest.mark.parametrize("damage, what", [
    (lambda it: shards(it)[0].unlink(), r"shard file __0_0\.distcp is missing"),
    (lambda it: shards(it)[0].write_bytes(shards(it)[0].read_bytes()[:1000]),
     r"__0_0\.distcp is truncated \(1000 bytes, the index needs \d+\)"),
    (remove_common_state, COMMON_STATE_GONE),
    (lambda it: (it / "metadata.json").unlink(), r"metadata\.json is missing"),
    (lambda it: (it / ".metadata").unlink(), r"\.metadata \(the tensor index\) is missing"),
    (lambda it: (it / ".metadata").write_bytes(b"garbage"), r"\.metadata \(the tensor index\) is unreadable"),
    (lambda it: (it / "cplm_state.json").write_text("{"), r"cplm_state\.json is unreadable"),
    # a record copied from another checkpoint: resuming from it set aside the checkpoint it resumed from (issue 43)
    (lambda it: (it / "cplm_state.json").write_text((it / "cplm_state.json").read_text().replace(
        '"iteration": 3', '"iteration": 7')), r"cplm_state\.json says iteration 7, its directory name iteration 3"),
], ids=["missing-shard", "truncated-shard", "missing-common", "missing-metadata", "missing-index", "garbled-index",
        "garbled-record", "record-of-another-iteration"])
def test_a_damaged_latest_checkpoint_names_what_is_missing_and_the_fix(run: Path, damage, what: str) -> None:
    damage(run / "checkpoints" / "iter_0000003")
    for lookup in (lambda: find_checkpoint(run / "checkpoints"), lambda: resolve_checkpoint(run)):
        with pytest.raises(CheckpointError, match=rf"^checkpoint \S+/checkpoints/iter_0000003 is damaged: {what}.*; {FIX}"):
            lookup()
    with pytest.raises(CheckpointError, match=r"iter_0000003 is damaged"):
        all_checkpoints(run)


@pytest.mark.parametrize("content, what", [
    ("garbage\n", r"latest is garbled: it holds 'garbage', not an iter_NNNNNNN name"),
    ("iter_0000007\n", r"latest points at iter_0000007, which does not exist"),
], ids=["garbled", "dangling"])
def test_a_bad_latest_names_the_fix(run: Path, content: str, what: str) -> None:
    (run / "checkpoints" / "latest").write_text(content)
    fix = FIX.replace("iter_0000002", "iter_0000003")  # nothing newer is damaged: the newest complete one
    with pytest.raises(CheckpointError, match=rf"{what}; {fix}"):
        resolve_checkpoint(run)


def test_latest_at_an_unfinished_save_names_the_previous_checkpoint(run: Path) -> None:
    (run / "checkpoints" / "iter_0000003" / "cplm_state.json").unlink()  # as if the save had crashed
    (run / "checkpoints" / "latest").write_text("iter_0000003\n")
    with pytest.raises(CheckpointError, match=rf"points at iter_0000003, whose save never finished.*; {FIX}"):
        resolve_checkpoint(run)
    (run / "checkpoints" / "latest").unlink()  # without latest the unfinished save is simply not a candidate
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["iter_0000001", "iter_0000002"]
    assert resolve_checkpoint(run).iteration == 2


def test_only_damaged_checkpoints_left_suggests_restoring_or_starting_over(run: Path) -> None:
    for it in (1, 2, 3):
        remove_common_state(run / "checkpoints" / f"iter_{it:07d}")
    with pytest.raises(CheckpointError, match=r"no other complete checkpoint exists under \S+: restore the missing "
                                              r"files, or start over with --set checkpoint.resume=false "
                                              r"checkpoint.overwrite=true"):
        resolve_checkpoint(run)


def test_the_checkpoint_record_has_one_reader_and_a_version(tmp_path: Path) -> None:
    """cplm_state.json round-trips; records of earlier versions of the trainer (no version key, no cp in the
    layout) read as version 1 with cp=1; an unknown version or a record without a layout is refused by name."""
    written = CheckpointRecord(iteration=7, consumed_tokens=3584, skipped_steps=1,
                               layout={"tp": 2, "pp": 1, "dp": 1, "cp": 2}, has_optimizer=False)
    (tmp_path / "cplm_state.json").write_text(written.to_json())
    assert read_record(tmp_path) == written and written.layout_text == "tp=2 pp=1 dp=1 cp=2"
    (tmp_path / "cplm_state.json").write_text(
        '{"iteration": 4, "consumed_tokens": 512, "skipped_steps": 0, "layout": {"tp": 1, "pp": 2, "dp": 1}, '
        '"has_optimizer": true}')
    assert read_record(tmp_path) == CheckpointRecord(4, 512, 0, {"tp": 1, "pp": 2, "dp": 1, "cp": 1}, True, 1)
    (tmp_path / "cplm_state.json").write_text('{"iteration": 4, "layout": {"tp": 1, "pp": 1, "dp": 1}, "version": 2}')
    with pytest.raises(CheckpointError, match=r"cplm_state\.json is a checkpoint record of version 2; this "
                                              r"cplm_megatron reads version 1"):
        read_record(tmp_path)
    (tmp_path / "cplm_state.json").write_text('{"iteration": 4}')
    with pytest.raises(CheckpointError, match=r"cplm_state\.json has no layout \(tp, pp, dp\)"):
        read_record(tmp_path)


def test_checksums_name_a_changed_file_and_the_previous_intact_checkpoint(run: Path) -> None:
    """Every file's size and xxh3-128 checksum is recorded when a save commits: a flipped byte (same size, the
    structure intact: the torch_dist reader loads it without a word) is found, and the refusal names the newest older
    checkpoint whose files match, skipping one that is damaged too."""
    root = run / "checkpoints"
    for it in (2, 3):
        shard = shards(root / f"iter_{it:07d}")[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    record = read_record(root / "iter_0000003")
    assert set(record.files) == set(checkpoint_files(root / "iter_0000003")) and "cplm_state.json" not in record.files
    assert resolve_checkpoint(run).iteration == 3  # the structure is intact: only the checksums tell
    problems = content_damage(root / "iter_0000003", record)
    assert problems == ["__0_0.distcp differs from its checksum (xxh3_128) recorded when it was saved"]
    assert damaged_contents_message(root / "iter_0000003", problems) == (
        f"checkpoint {root}/iter_0000003 is damaged: {problems[0]}; the previous intact checkpoint is iter_0000001: "
        f"resume from it with echo iter_0000001 > {root}/latest (the damaged one is then kept aside, not deleted)")
    assert is_intact(root / "iter_0000001") and not is_intact(root / "iter_0000002")
