"""Write a benchmark's JSON after every variant, so a run that is killed or times out keeps what it measured.

The file is replaced atomically (written beside it, then renamed): a reader never sees half a file.
`complete` is false until the benchmark's last variant is written.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional


def write_partial(path: Optional[str], payload: Mapping[str, Any], complete: bool = False) -> None:
    """``payload`` + ``{"complete": complete}`` -> ``path`` (no-op without a path)."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**payload, "complete": complete}, indent=2, default=str))
    os.replace(tmp, target)
