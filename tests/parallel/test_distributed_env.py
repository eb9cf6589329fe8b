"""Launcher environments -> process coordinates; layout validation errors."""
import pytest

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import load_preset
from cplm_megatron.model.layout import validate_layout
from cplm_megatron.parallel.distributed import ParallelConfig, detect_env, expand_hostlist, master_port_for_job

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


def test_torchrun_env():
    env = detect_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "node7", "MASTER_PORT": "29555"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 1, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("node7", 29555, "torchrun")


def test_slurm_env_derives_master_from_nodelist_and_job_id():
    env = detect_env({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                      "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "123456"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (9, 16, 1, 8)
    assert env.master_addr == "gpu07" and env.launcher == "slurm"
    assert env.master_port == master_port_for_job("123456") == 15000 + 123456 % 20000


def test_single_process_default():
    env = detect_env({})
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "single") and env.master_port > 0


@pytest.mark.parametrize("nodelist, hosts", [
    ("c1", ["c1"]),
    ("c[1-3]", ["c1", "c2", "c3"]),
    ("gpu[01-02,7],login", ["gpu01", "gpu02", "gpu7", "login"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
])
def test_expand_hostlist(nodelist, hosts):
    assert expand_hostlist(nodelist) == hosts


@pytest.mark.parametrize("world, kw, preset, overrides, message", [
    (3, dict(tp=2), "tiny", {}, r"world size 3 is not divisible by parallel.tp\*parallel.pp\*parallel.cp = 2\*1\*1 = 2"),
    (1, dict(tp=3), "tiny", {}, r"model.num_attention_heads=4 is not divisible by parallel.tp=3"),  # the heads first
    (3, dict(tp=3), "tiny", {}, r"model.num_attention_heads=4 is not divisible by parallel.tp=3"),
    (2, dict(tp=2), "smollm2-360m", {}, r"model.num_attention_heads=15 is not divisible by parallel.tp=2"),
    (4, dict(tp=4), "tiny", {}, r"KV heads \(model.num_query_groups=2\) are not divisible by parallel.tp=4"),
    (3, dict(pp=3), "tiny", {}, r"model.num_layers=4 is not divisible by parallel.pp=3"),
    (4, dict(pp=2, vpp=4), "tiny", {}, r"model.num_layers=4 is not divisible by parallel.pp=2 x parallel.vpp=4"),
    (2, dict(tp=2), "tiny", {"vocab_pad_multiple": 1, "vocab_size": 4097},
     r"padded vocab 4097 .* is not divisible by parallel.tp=2"),
])
def test_layout_errors_name_the_values(world, kw, preset, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_layout(world, ParallelConfig(**kw), load_preset(preset, **overrides))


def test_valid_layout_returns_dp():
    assert validate_layout(8, ParallelConfig(tp=2, pp=2), load_preset("tiny")) == 2


def test_free_ports_lie_below_the_ephemeral_range_and_do_not_follow_the_seed():
    """A port from the ephemeral range can be taken by any process's outgoing connection between free_port()
    and the bind after it (EADDRINUSE seen with a study running beside the suite); below it, only another caller
    of free_port() could. Training seeds `random`: the ports must not repeat with the seed."""
    import random
    import socket

    from cplm_megatron.parallel.env import _ephemeral_range, free_port

    low, _ = _ephemeral_range()
    ports = []
    for _ in range(20):
        random.seed(1234)
        ports.append(free_port())
    assert all(20000 <= p < low for p in ports) and len(set(ports)) > 10
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))  # free when returned
