"""Node layout detection and the environment streaming reads (pure logic; see the distributed test)."""
from __future__ import annotations

import os

import pytest

from cplm_megatron.data.streaming_world import (
    NodeLayout,
    detect_node_layout,
    layout_from_machines,
    machine_id,
    streaming_world_env,
)


def test_layout_from_machines() -> None:
    machines = ["m0"] * 4 + ["m1"] * 4
    assert layout_from_machines(machines, 0) == NodeLayout(0, 8, 0, 4)
    assert layout_from_machines(machines, 6) == NodeLayout(6, 8, 2, 4)
    assert layout_from_machines(["solo"], 0) == NodeLayout(0, 1, 0, 1)


@pytest.mark.parametrize("machines", [["a", "b", "a", "b"], ["a", "a", "a", "b"], ["a", "b", "b", "c"]])
def test_layouts_streaming_cannot_express_are_rejected(machines: list[str]) -> None:
    with pytest.raises(RuntimeError, match="consecutive ranks"):
        for rank in range(len(machines)):
            layout_from_machines(machines, rank)


def test_single_process_layout_and_machine_id() -> None:
    assert detect_node_layout() == NodeLayout(0, 1, 0, 1)  # no process group: a world of one
    assert machine_id() == machine_id() and "/" in machine_id()


def test_env_is_set_inside_and_restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with streaming_world_env(NodeLayout(3, 8, 1, 4)):
        assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")] == ["3", "8", "1", "4"]
    assert os.environ["RANK"] == "5" and "LOCAL_RANK" not in os.environ
