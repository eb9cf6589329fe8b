"""Workers' exit codes recorded for pretrain/launch_torchrun.py, and how the launcher combines them."""
from __future__ import annotations

from pathlib import Path

import pytest

from cplm_megatron.training.exit_status import (
    EXIT_STATUS_DIR_ENV,
    launcher_exit_code,
    read_exit_statuses,
    record_exit_status,
)

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def test_statuses_round_trip_per_rank(tmp_path: Path) -> None:
    record_exit_status(75, {EXIT_STATUS_DIR_ENV: str(tmp_path), "RANK": "0"})
    record_exit_status(2, {EXIT_STATUS_DIR_ENV: str(tmp_path), "RANK": "1"})
    record_exit_status(0, {"RANK": "2"})  # no launcher asked: nothing written
    assert read_exit_statuses(tmp_path) == {0: 75, 1: 2}


@pytest.mark.parametrize("statuses, torchrun, stop, expected", [
    ({0: 0, 1: 0}, 0, False, 0),
    ({0: 75, 1: 75}, 1, False, 75),  # train.exit_after_iters, or SIGTERM sent to torchrun itself
    ({0: 75, 1: 75}, 1, True, 75),  # the launcher forwarded a stop
    ({0: 75}, 1, True, 75),  # rank 1 was torn down by torchrun after the checkpoint was complete
    ({}, 1, True, 75),  # stopped before any worker started training: resume from the last checkpoint
    ({0: 2, 1: 2}, 1, False, 2),  # bad input on every rank
    ({0: 75, 1: 1}, 1, True, 1),  # a worker failed: not "resume me"
    ({0: 2}, 1, False, 2),
    ({}, 1, False, 1),  # crashed without reporting (a signal, a segfault)
    ({0: 1, 1: 2}, 1, False, 1),
])
def test_launcher_exit_code(statuses: dict, torchrun: int, stop: bool, expected: int) -> None:
    assert launcher_exit_code(statuses, torchrun, stop) == expected
