"""Find Megatron training checkpoints: a run dir, its `checkpoints/` root, or one `iter_*` directory.

Reads only the file layout the trainer writes (cplm_megatron.training.checkpointing): `latest`,
`iter_NNNNNNN/` with `metadata.json` and `cplm_state.json`. No process group is needed.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from cplm_megatron.training.checkpointing import (
    LATEST,
    STATE_JSON,
    list_checkpoints,
    read_latest,
)

_ITER_DIR = re.compile(r"^iter_(\d+)$")


@dataclass(frozen=True)
class CheckpointRef:
    """One complete checkpoint directory and the iteration it was saved at."""

    path: Path
    iteration: int


def _is_checkpoint(path: Path) -> bool:
    return (path / "metadata.json").is_file() and (path / STATE_JSON).is_file()


def _ref(path: Path) -> CheckpointRef:
    record = json.loads((path / STATE_JSON).read_text())
    if "iteration" in record:
        return CheckpointRef(path, int(record["iteration"]))
    match = _ITER_DIR.match(path.name)
    return CheckpointRef(path, int(match.group(1)) if match else 0)


def _checkpoint_root(path: Path) -> Path:
    """`path` itself when it holds iter_* directories or `latest`, else `path/checkpoints`."""
    if (path / LATEST).is_file() or any(path.glob("iter_*")):
        return path
    return path / "checkpoints"


def resolve_checkpoint(path: str | Path) -> CheckpointRef:
    """The checkpoint `path` names: an iter_* dir as is, else the `latest` one of a run dir or checkpoint root."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--checkpoint {path} does not exist; pass a run dir (run.dir), its "
                                f"checkpoints/ directory or one checkpoints/iter_* directory")
    if _is_checkpoint(path):
        return _ref(path)
    root = _checkpoint_root(path)
    latest = read_latest(root)
    if latest is None:
        found = list_checkpoints(root)
        if not found:
            raise FileNotFoundError(f"no complete checkpoint under {path} (looked for {root}/{LATEST} and "
                                    f"{root}/iter_*/{STATE_JSON}); did the training run save one?")
        latest = found[-1]
    return _ref(latest)


def all_checkpoints(path: str | Path) -> list[CheckpointRef]:
    """Every complete checkpoint of a run dir (or checkpoint root), by increasing iteration."""
    root = _checkpoint_root(Path(path))
    refs = [_ref(p) for p in list_checkpoints(root)]
    if not refs:
        raise FileNotFoundError(f"no complete checkpoint under {path} (looked in {root}/iter_*)")
    return sorted(refs, key=lambda r: r.iteration)
