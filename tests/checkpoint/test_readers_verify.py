"""Every reader of a checkpoint checks its files against the checksums recorded when it was saved, before reading
anything: training, evaluation (`python -m cplm_megatron.evaluate`, tools/evaluate.py, --all-checkpoints, the
study's scorers), conversion (tools/convert_to_hf.py), weights-only loads. A checkpoint with 5 flipped bytes in
`__0_0.distcp` was evaluated and exported with exit 0 (the export's embeddings off by up to 0.06) while training
refused it: now each refuses it with the same one line naming the previous intact checkpoint, exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cplm_megatron.checkpoint.lookup import damaged_contents_message
from cplm_megatron.errors import CheckpointError
from tests import harness
from tests.checkpoint.checkpoint_files import copy_run, damage_common_state, shards, tiny_config, write_checkpoints

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

DIFFERS = "__0_0.distcp differs from its checksum (xxh3_128) recorded when it was saved"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run dir with committed checkpoints at iterations 1, 2, 3 (`latest` -> iter_0000003)."""
    run = tmp_path_factory.mktemp("readers") / "run"
    write_checkpoints(tiny_config(run), [1, 2, 3])
    return run


def flip_bytes(file: Path, count: int = 5) -> None:
    """Flip `count` bytes in the middle of `file` (its tensor data: the torch_dist reader loads it without a word)."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    file.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def damaged_run(saved_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`saved_run` with 5 bytes flipped in iter_0000003/__0_0.distcp (read only)."""
    run = copy_run(saved_run, tmp_path_factory.mktemp("damaged") / "run")
    flip_bytes(shards(run / "checkpoints" / "iter_0000003")[0])
    return run


def refusal(run: Path, iteration: int = 3) -> str:
    """The one line every reader prints for `run`'s damaged checkpoint `iteration`."""
    return damaged_contents_message(run / "checkpoints" / f"iter_{iteration:07d}", [DIFFERS])


def error_lines(stderr: str) -> list[str]:
    """stderr without the `[compat]` notes megatron-core >= 0.19 prints once per process."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("[compat] ")]


def test_the_refusal_names_the_previous_intact_checkpoint(damaged_run: Path) -> None:
    root = damaged_run / "checkpoints"
    assert refusal(damaged_run) == (
        f"checkpoint {root}/iter_0000003 is damaged: {DIFFERS}; the previous intact checkpoint is iter_0000002: "
        f"resume from it with echo iter_0000002 > {root}/latest (the damaged one is then kept aside, not deleted)")


def test_evaluation_refuses_a_flipped_byte_with_one_line_exit_2(damaged_run: Path, tmp_path: Path) -> None:
    """`python -m cplm_megatron.evaluate` (what the study runs; tools/evaluate.py is its script), in its own
    interpreter: the exit code and stderr are what a user and the study runner see."""
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "cplm_megatron.evaluate", "--checkpoint", str(damaged_run),
                           "--tasks", "copy", "--limit", "2", "--no-progress", "--output", str(out)],
                          cwd=harness.REPO, env=harness.process_env(), capture_output=True, text=True,
                          timeout=harness.PROCESS_TIMEOUT_S)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [f"error: {refusal(damaged_run)}"], proc.stderr[-3000:]
    assert not out.exists()


def test_conversion_refuses_a_flipped_byte_with_one_line_exit_2(damaged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    proc = harness.run_tool_warm("convert_to_hf", "--checkpoint", str(damaged_run), "--output", str(out))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [line for line in error_lines(proc.stderr) if not line.startswith("[convert_to_hf] ")]
    assert lines == [f"error: {refusal(damaged_run)}"], proc.stderr[-3000:]
    assert not out.exists()


def test_every_reader_refuses_it_with_the_same_line(damaged_run: Path) -> None:
    """Training (the Checkpointer, resume or checkpoint.load), the scorers (evaluation, the study, the long-context
    benchmark), the HF export's reader, and weights-only loads: one message, before anything is read."""
    from cplm_megatron.checkpoint.checkpointer import Checkpointer
    from cplm_megatron.checkpoint.weights import load_plain_tensors, load_weights
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron
    from cplm_megatron.hf.megatron_checkpoint import open_checkpoint
    from cplm_megatron.model.builder import build_run, model_run

    cfg = tiny_config(damaged_run)
    iter_dir = damaged_run / "checkpoints" / "iter_0000003"
    expected = refusal(damaged_run)
    readers = {
        "scorer": lambda: MegatronScorer.load(damaged_run),
        "scorer of the iter_* dir": lambda: MegatronScorer.load(iter_dir),
        "untrained scorer": lambda: MegatronScorer.initial(iter_dir),
        "hf export": lambda: open_checkpoint(damaged_run),
        "plain tensors": lambda: load_plain_tensors(iter_dir),
    }
    with single_process_megatron(cfg.model, cfg.run.seed):
        chunk = build_run(model_run(cfg.model, cfg.copy_head)).model
        readers["weights only"] = lambda: load_weights([chunk], iter_dir)
        readers["training"] = lambda: Checkpointer(iter_dir.parent, log=lambda m: None).load(
            iter_dir, [chunk], None, None, load_optimizer=False)
        for name, read in readers.items():
            with pytest.raises(CheckpointError) as refused:
                read()
            assert str(refused.value) == expected, name


def test_all_checkpoints_refuses_the_damaged_one(damaged_run: Path, tmp_path: Path, capsys) -> None:
    from tests.data_fixtures import load_tool

    out = tmp_path / "curve.json"
    code = load_tool("evaluate").main(["--checkpoint", str(damaged_run), "--all-checkpoints", "--tasks", "copy",
                                       "--limit", "2", "--no-progress", "--output", str(out)])
    assert code == 2
    assert error_lines(capsys.readouterr().err) == [f"error: {refusal(damaged_run)}"]
    assert not out.exists()


def test_a_flipped_byte_in_the_common_state_is_the_same_refusal(saved_run: Path, tmp_path: Path) -> None:
    """The saved config is read before the tensors (by training's resume check and by every reader): a damaged
    common state is named by its checksum too, not as an unreadable pickle."""
    from cplm_megatron.checkpoint.lookup import read_saved_config
    from cplm_megatron.hf.megatron_checkpoint import open_checkpoint

    run = copy_run(saved_run, tmp_path / "run")
    iter_dir = run / "checkpoints" / "iter_0000003"
    damaged = damage_common_state(iter_dir)
    expected = damaged_contents_message(iter_dir, [f"{damaged.name} differs from its checksum (xxh3_128) recorded "
                                                   f"when it was saved"])
    for read in (lambda: read_saved_config(iter_dir), lambda: open_checkpoint(run)):
        with pytest.raises(CheckpointError) as refused:
            read()
        assert str(refused.value) == expected


def test_a_damaged_common_state_without_its_save_record_is_one_line(saved_run: Path, tmp_path: Path) -> None:
    """Where no checksums were recorded (cplm_state.json gone: a save cut short, or a checkpoint from elsewhere), the
    unreadable common state is one line naming the file's own error, not torch's multi-line per-rank report."""
    from cplm_megatron.checkpoint.lookup import STATE_JSON, read_saved_config

    iter_dir = copy_run(saved_run, tmp_path / "run") / "checkpoints" / "iter_0000003"
    (iter_dir / STATE_JSON).unlink()
    damage_common_state(iter_dir)
    with pytest.raises(CheckpointError) as refused:
        read_saved_config(iter_dir)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"checkpoint {iter_dir}: "), message
    assert "is unreadable (" in message and "CheckpointException" not in message, message
