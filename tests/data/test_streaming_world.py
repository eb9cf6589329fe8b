"""Node layout detection and the environment streaming reads (pure logic; see the distributed test)."""
from __future__ import annotations

import os
import subprocess
import sys

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


def test_the_suites_cleanup_removes_only_its_own_segments(tmp_path) -> None:
    """tests/data_fixtures.py removes the segments of its own block's datasets (their filelocks name the prefix in
    the block's TMPDIR), never another job's on the machine, nor one a live process still maps."""
    from tests.data_fixtures import SHM_DIR, streaming_segments_removed

    (tmp_path / "999971_barrier_filelock").write_text("")
    live = None
    try:
        with streaming_segments_removed(tmp_path):
            for name in ("999971_locals", "999972_locals"):
                (SHM_DIR / name).write_bytes(b"x")
            live = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time\n"
                                     "f = open('/dev/shm/999971_barrier', 'w+b'); f.write(b'x' * 4096); f.flush()\n"
                                     "m = mmap.mmap(f.fileno(), 4096); print('ready', flush=True); time.sleep(60)"],
                                    stdout=subprocess.PIPE, text=True)
            assert live.stdout.readline() == "ready\n"
        assert not (SHM_DIR / "999971_locals").exists()  # ours, unmapped: removed
        assert (SHM_DIR / "999972_locals").exists()  # another job's prefix: kept
        assert (SHM_DIR / "999971_barrier").exists()  # mapped by a live process: kept
    finally:
        if live is not None:
            live.kill()
            live.wait()
        for name in ("999971_locals", "999972_locals", "999971_barrier"):
            (SHM_DIR / name).unlink(missing_ok=True)


def test_the_dataset_lock_is_shared_logs_a_wait_and_gives_up(tmp_path, capsys) -> None:
    """The machine's dataset lock: created world-writable (a second user on a shared node may take it), a wait
    says so after a few seconds and ends with one clear error after a bound (issue 30 item 4)."""
    import fcntl

    from cplm_megatron.data.manifest import DatasetError
    from cplm_megatron.data.streaming_world import take_open_lock

    path = tmp_path / "cplm-streaming-open.lock"
    held = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\n"
                             "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline() == "held\n"
        with pytest.raises(DatasetError, match=r"waited \d+ s for the dataset lock .*fuser"):
            take_open_lock(path, log_after_s=0.3, give_up_after_s=1.0)
        assert "waiting for the dataset lock" in capsys.readouterr().out
    finally:
        held.kill()
        held.wait()
    lock = take_open_lock(path)
    assert path.stat().st_mode & 0o777 == 0o666
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def test_the_shared_memory_check_on_an_injected_dir(tmp_path) -> None:
    """check_shared_memory reserves the room it is asked for and leaves nothing; too little room or a directory it
    cannot write is one DatasetError naming the fix (tests/data/test_shared_memory.py: a real full or read-only
    /dev/shm under pretrain)."""
    from cplm_megatron.data.manifest import DatasetError
    from cplm_megatron.data.streaming_world import check_shared_memory

    check_shared_memory(1 << 20, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DatasetError, match=rf"^{tmp_path} is full \(.* free, the data loader needs about .*--shm-size"):
        check_shared_memory(1 << 60, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DatasetError, match=rf"^cannot create files in {tmp_path}/gone \(No such file or directory\)"):
        check_shared_memory(1 << 20, tmp_path / "gone")
