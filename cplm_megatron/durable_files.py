"""Records that survive a crash or a full disk: whole-file writes through a temporary file and a rename (a reader
sees the old file or the new one, never half of one), appends that leave no half line behind, and a JSON-lines
reader that drops a line cut short (a write interrupted by a full disk or a kill) instead of failing on it."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` in one step (written and synced to `path`.tmp, then renamed over it); on a failed
    write (a full disk) the temporary is removed and `path` keeps its previous content."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append `line` (a newline is added) in one write; when the write fails part-way (a full disk), the file is cut
    back to its previous length, so no half line is left for a reader, and the OSError is raised."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:  # a short write is followed by the one that fails with the reason (ENOSPC, EFBIG)
                view = view[os.write(fd, view):]
        except OSError:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


@dataclass
class JsonLines:
    """What a JSON-lines file holds: its records, and the (1-based) numbers of the lines that were not JSON objects
    (a line cut short by an interrupted write; `last_cut`: the file's last line was one)."""

    records: List[Dict[str, Any]] = field(default_factory=list)
    bad_lines: List[int] = field(default_factory=list)
    last_cut: bool = False

    def note(self, path: Path) -> str:
        """One line saying which lines were dropped and why ('' when none were)."""
        if not self.bad_lines:
            return ""
        if self.last_cut and len(self.bad_lines) == 1:
            return (f"{path}: dropped its last line (line {self.bad_lines[0]}), cut short by an interrupted write "
                    f"(a full disk or a kill)")
        return (f"{path}: dropped {len(self.bad_lines)} line(s) that are not JSON records (line(s) "
                f"{', '.join(map(str, self.bad_lines[:10]))}{', ...' if len(self.bad_lines) > 10 else ''}): "
                f"cut short by interrupted writes (a full disk or a kill)")


def read_json_lines(path: Path) -> JsonLines:
    """Every JSON object of a JSON-lines file (empty when the file is missing); lines that do not parse, or parse
    to something other than an object, are left out and numbered in `bad_lines`."""
    out = JsonLines()
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    lines = raw.split(b"\n")
    ends_cut = not raw.endswith(b"\n") and raw != b""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            record = None
        if isinstance(record, dict):
            out.records.append(record)
        else:
            out.bad_lines.append(number)
            out.last_cut = number == len(lines) and ends_cut
    return out
