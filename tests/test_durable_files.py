"""Records that survive a torn write (issue 43 item 1): a JSON-lines file with a cut line reads without it, an
append that fails part-way leaves no half line, and the trainer's metrics log drops a cut line on resume with one
line instead of failing (in-process, no training)."""
from __future__ import annotations

import contextlib
import json
import resource
import signal
from pathlib import Path
from typing import Iterator

import pytest

from cplm_megatron.durable_files import append_line, read_json_lines, write_atomic


def _lines(*records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_a_cut_last_line_is_dropped_and_named(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"iteration": 1}, {"iteration": 2}) + '{"iteration": 3, "lo')
    found = read_json_lines(path)
    assert [r["iteration"] for r in found.records] == [1, 2] and found.bad_lines == [3] and found.last_cut
    assert found.note(path) == (f"{path}: dropped its last line (line 3), cut short by an interrupted write "
                                f"(a full disk or a kill)")
    path.write_text('{"iteration": 1}\n{"iter\n' + _lines({"iteration": 3}) + "[1]\n")
    found = read_json_lines(path)
    assert [r["iteration"] for r in found.records] == [1, 3] and found.bad_lines == [2, 4] and not found.last_cut
    assert "dropped 2 line(s) that are not JSON records (line(s) 2, 4)" in found.note(path)
    assert read_json_lines(tmp_path / "missing.jsonl").records == []


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Limit this process's file writes to `size` bytes inside the block (RLIMIT_FSIZE: the kernel cuts a write at
    the limit, as a full disk does). Lifted before the block's end: pytest's own output may go to a file."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_an_append_cut_by_the_disk_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append_line(path, json.dumps({"iteration": 1}))
    before = path.read_bytes()
    with file_size_limit(len(before) + 10):  # room for 10 more bytes: the next record is cut after them
        with pytest.raises(OSError):
            append_line(path, json.dumps({"iteration": 2, "loss": 1.2345}))
        with pytest.raises(OSError):
            write_atomic(tmp_path / "timing.json", json.dumps({"train_seconds": 1.0} | {f"k{i}": i for i in range(9)}))
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_the_metrics_log_drops_a_cut_line_on_resume_and_skips_records_it_cannot_write(
        tmp_path: Path, capsys) -> None:
    from cplm_megatron.run_config import LoggingConfig
    from cplm_megatron.training.metrics_log import MetricsLogger

    path = tmp_path / "metrics.jsonl"
    path.write_text(_lines({"iteration": 1, "loss": 3.0}, {"iteration": 2, "loss": 2.5}) + '{"iteration": 3, "lo')
    logger = MetricsLogger(tmp_path, LoggingConfig(wandb=False), {}, True, resume_iteration=2)
    assert f"[train] {path}: dropped its last line (line 3)" in capsys.readouterr().out
    assert path.read_text() == _lines({"iteration": 1, "loss": 3.0}, {"iteration": 2, "loss": 2.5})
    with file_size_limit(path.stat().st_size + 5):
        logger.log({"iteration": 3, "loss": 2.0})
        logger.log({"iteration": 4, "loss": 1.9})
    logger.log({"iteration": 5, "loss": 1.8})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith(f"[train] cannot write {path} (File too large): skipping its records")
    assert out[1] == f"[train] {path} is writable again: 2 record(s) were skipped (iterations 3-4)"
    assert [r["iteration"] for r in read_json_lines(path).records] == [1, 2, 5] and not read_json_lines(path).bad_lines
