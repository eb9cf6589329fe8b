"""All-or-nothing output directories: up-to-date detection, replacement, leftovers of killed builds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cplm_megatron.data.atomic_output import (
    OutputError,
    build_atomically,
    is_up_to_date,
    write_marker,
)

MARKER = "done.json"


def build_with(content: str, fingerprint: str, fail: bool = False):
    def build(tmp: Path) -> None:
        (tmp / "data.txt").write_text(content)
        if fail:
            raise KeyboardInterrupt  # like Ctrl-C in the middle of a build
        write_marker(tmp, MARKER, {"fingerprint": fingerprint})

    return build


def test_build_skip_replace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert build_atomically(out, MARKER, "f1", build_with("one", "f1"))
    assert not build_atomically(out, MARKER, "f1", build_with("ignored", "f1"))
    assert (out / "data.txt").read_text() == "one"
    assert build_atomically(out, MARKER, "f2", build_with("two", "f2"))
    assert (out / "data.txt").read_text() == "two" and is_up_to_date(out, MARKER, "f2")


def test_interrupted_build_keeps_old_output_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_atomically(out, MARKER, "f1", build_with("one", "f1"))
    with pytest.raises(KeyboardInterrupt):
        build_atomically(out, MARKER, "f2", build_with("two", "f2", fail=True))
    assert (out / "data.txt").read_text() == "one" and is_up_to_date(out, MARKER, "f1")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def test_leftovers_of_a_killed_build_are_removed_and_never_look_complete(tmp_path: Path) -> None:
    stale = tmp_path / ".out.tmp-999999"
    stale.mkdir()
    write_marker(stale, MARKER, {"fingerprint": "f1"})
    assert not (tmp_path / "out").exists()
    assert build_atomically(tmp_path / "out", MARKER, "f1", build_with("one", "f1"))
    assert not stale.exists()


def test_refuses_to_replace_foreign_directories(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match=r"out is not empty and was not written by this tool \(no done\.json\)"):
        build_atomically(tmp_path / "out", MARKER, "f", build_with("y", "f"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is not a directory"):
        build_atomically(tmp_path / "file", MARKER, "f", build_with("y", "f"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MARKER).write_text(json.dumps({"fingerprint": "old"}))
    assert build_atomically(tmp_path / "bad", MARKER, "f", build_with("y", "f"))  # ours, outdated: rebuilt
