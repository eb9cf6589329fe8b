"""Build an output directory all-or-nothing, and skip the build when it is already up to date.

A build writes into a hidden temporary sibling (``.NAME.tmp-PID``); its last act is to write a
marker file (a JSON record holding the build's ``fingerprint``). Only then is the directory renamed
into place. So a directory at the output path is always complete, an interrupted build leaves only
a hidden temporary (removed by the next build), and a rerun whose fingerprint matches the marker's
is a no-op, unless an optional `check` finds the existing output damaged: then it is rebuilt. Builds of
one output are serialized by an exclusive lock on ``.NAME.lock``.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cplm_megatron.errors import UserError

# Raises (any UserError, naming what is wrong) when an up-to-date output is damaged.
OutputCheck = Callable[[Path], None]


class OutputError(UserError):
    """The output path cannot be (re)built; the message names it and the fix."""


def fingerprint(payload: Any) -> str:
    """sha256 of a JSON-serializable description of a build's inputs and settings."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def file_signatures(files: Sequence[Path]) -> list[list[Any]]:
    """[path, size, mtime_ns] per file: what decides whether an input changed (as make does)."""
    signatures = []
    for file in files:
        stat = Path(file).stat()
        signatures.append([str(file), stat.st_size, stat.st_mtime_ns])
    return signatures


def read_marker(output: Path, marker: str) -> dict[str, Any] | None:
    """The marker record of a completed build at `output`, or None."""
    path = Path(output) / marker
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def is_up_to_date(output: Path, marker: str, build_fingerprint: str) -> bool:
    """Whether `output` holds a completed build with this fingerprint."""
    record = read_marker(output, marker)
    return record is not None and record.get("fingerprint") == build_fingerprint


@contextmanager
def _exclusive_lock(output: Path) -> Iterator[None]:
    lock_path = output.parent / f".{output.name}.lock"
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove_stale_temporaries(output: Path) -> None:
    """Leftovers of interrupted builds (safe: we hold the build lock)."""
    for prefix in (f".{output.name}.tmp-", f".{output.name}.old-"):
        for leftover in output.parent.glob(prefix + "*"):
            shutil.rmtree(leftover, ignore_errors=True)


def build_atomically(
    output: Path, marker: str, build_fingerprint: str, build: Callable[[Path], None],
    check: OutputCheck | None = None, on_damage: Callable[[str], None] | None = None,
) -> bool:
    """Run `build(tmp_dir)` and move its result to `output`; False (and no work) if up to date and, when
    `check` is given, intact (a damaged output is rebuilt; `on_damage` hears why).

    `build` must write the marker file (with ``"fingerprint": build_fingerprint``) last.
    """
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(output):
        if is_up_to_date(output, marker, build_fingerprint):
            try:
                if check is not None:
                    check(output)
                return False
            except UserError as damage:
                if on_damage is not None:
                    on_damage(str(damage))
        if output.exists() and not output.is_dir():
            raise OutputError(f"output path {output} exists and is not a directory; pick another path")
        if output.exists() and read_marker(output, marker) is None and any(output.iterdir()):
            raise OutputError(
                f"output directory {output} is not empty and was not written by this tool "
                f"(no {marker}); remove it or choose another output path"
            )
        _remove_stale_temporaries(output)
        tmp = output.parent / f".{output.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            build(tmp)
            if not is_up_to_date(tmp, marker, build_fingerprint):
                raise RuntimeError(f"internal error: the build did not write {marker} with its fingerprint")
            if output.exists():
                old = output.parent / f".{output.name}.old-{os.getpid()}"
                os.rename(output, old)
                os.rename(tmp, output)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, output)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return True


def write_marker(directory: Path, marker: str, record: dict[str, Any]) -> None:
    """Write a marker record (call last in a build)."""
    (Path(directory) / marker).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
