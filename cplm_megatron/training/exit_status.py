"""Each training process's exit code, for a launcher that wraps torchrun.

torchrun reports any worker exit other than 0 as its own exit code 1 (and a SIGTERM to torchrun as 1
too), so "stopped with a checkpoint, resume me" (75) and "bad input" (2) are lost on the way out.
`pretrain/launch_torchrun.py` names a directory in `EXIT_STATUS_DIR_ENV`; every worker writes its exit
code there (`record_exit_status`), and the launcher turns them back into one exit code
(`launcher_exit_code`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Optional

from cplm_megatron.entry_points import BAD_INPUT_EXIT_CODE  # noqa: F401 - re-exported: the trainer's exit codes live here
from cplm_megatron.training.signals import RESUME_EXIT_CODE

EXIT_STATUS_DIR_ENV = "CPLM_EXIT_STATUS_DIR"


def record_exit_status(code: int, env: Optional[Mapping[str, str]] = None) -> None:
    """Write this process's exit code as `<dir>/rank<RANK>` when a launcher asked for it (else nothing)."""
    env = os.environ if env is None else env
    directory = env.get(EXIT_STATUS_DIR_ENV)
    if not directory:
        return
    path = Path(directory) / f"rank{env.get('RANK', '0')}"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, path)


def read_exit_statuses(directory: Path) -> Dict[int, int]:
    """{rank: exit code} of the workers that recorded one."""
    statuses = {}
    for path in Path(directory).glob("rank*"):
        if path.name[4:].isdigit() and path.read_text().strip().lstrip("-").isdigit():
            statuses[int(path.name[4:])] = int(path.read_text())
    return statuses


def launcher_exit_code(statuses: Mapping[int, int], torchrun_code: int, stop_requested: bool) -> int:
    """One exit code for the launch.

    0 when torchrun succeeded; 75 when every worker that reported stopped with a checkpoint (a worker
    returns 75 only after the save's final barrier, so the checkpoint is complete), or when a stop was
    requested and no worker reported anything else (stopped before training started: resume from the last
    checkpoint); 2 when every reporting worker refused its input; else torchrun's code (a failure).
    """
    if torchrun_code == 0:
        return 0
    codes = set(statuses.values())
    if codes == {RESUME_EXIT_CODE} or (stop_requested and not codes):
        return RESUME_EXIT_CODE
    if codes == {BAD_INPUT_EXIT_CODE}:
        return BAD_INPUT_EXIT_CODE
    return torchrun_code or 1
