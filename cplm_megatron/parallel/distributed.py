"""Process-group and Megatron parallel-state setup from torchrun or SLURM environments.

`init_process_groups` (called by cplm_megatron/model/layout.py's `init_distributed`, which checks the layout
against the model first, so a bad layout fails before any rendezvous) refuses to fall back to CPU where GPUs
were promised, checks that the entry point applied the CPU-compat layer (cpu_compat.setup_compat), picks
nccl on CUDA and gloo on CPU,
initializes Megatron's parallel state (tp, pp, virtual pp, sp; dp derived) and seeds every RNG the
way Megatron-LM does.
"""
from __future__ import annotations

import os
import random
import re
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import List, Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist

from cplm_megatron.parallel.config import ParallelConfig, check_world


@dataclass
class DistEnv:
    """Where this process sits in the job, as the launcher told it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # torchrun | slurm | single


@dataclass
class RankLayout:
    """This rank's coordinates in the Megatron process grid."""

    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    vpp: Optional[int]
    sp: bool
    tp_rank: int
    pp_rank: int
    dp_rank: int
    device: torch.device
    cp: int = 1


def expand_hostlist(nodelist: str) -> List[str]:
    """SLURM host list -> host names: 'gpu[01-03,7],login' -> ['gpu01', 'gpu02', 'gpu03', 'gpu7', 'login']."""
    hosts: List[str] = []
    for match in re.finditer(r"([^,\[]+)(\[([^\]]*)\])?([^,\[]*)", nodelist):
        prefix, ranges, suffix = match.group(1), match.group(3), match.group(4)
        if not prefix and not ranges:
            continue
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                hosts.extend(f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi) + 1))
            else:
                hosts.append(prefix + part + suffix)
    return hosts


def master_port_for_job(job_id: str) -> int:
    """A port all tasks of one SLURM job agree on without talking: 15000 + job id mod 20000."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 15000 + int(digits) % 20000


def _ephemeral_range() -> tuple:
    """The kernel's range for outgoing connections' source ports (Linux; the usual default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """An unused TCP port on 127.0.0.1, below the ephemeral range: a port the kernel hands out for outgoing
    connections (what binding port 0 returns) can be taken by any process between this check and the bind
    that follows it; a random port below the range can only collide with another caller of this function."""
    low = 20000
    high = max(low + 1000, _ephemeral_range()[0] - 1)
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # everything busy: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def detect_env(env: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Read torchrun's (RANK/WORLD_SIZE/...) or SLURM's (SLURM_PROCID/NTASKS/...) environment."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        hosts = expand_hostlist(nodelist)
        job_id = env.get("SLURM_JOB_ID", "0")
        ntasks = int(env["SLURM_NTASKS"])
        per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=ntasks,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=int(per_node) if per_node.isdigit() else ntasks,
            master_addr=env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT") or master_port_for_job(job_id)),
            launcher="slurm",
        )
    return DistEnv(0, 1, 0, 1, "127.0.0.1", int(env.get("MASTER_PORT", 0)) or free_port(), "single")


def set_seed(seed: int) -> None:
    """Megatron-LM's seeding: seed + 100 * pipeline rank for python/numpy/torch, then the TP RNG tracker."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    stage_seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    random.seed(stage_seed)
    np.random.seed(stage_seed)
    torch.manual_seed(stage_seed)  # on CPU also the "data-parallel" RNG state
    tensor_parallel.model_parallel_cuda_manual_seed(stage_seed)


def init_process_groups(parallel: ParallelConfig, seed: int = 1234, env: Optional[DistEnv] = None) -> RankLayout:
    """Initialize torch.distributed + Megatron parallel state for this process (the layout checked against the
    model first: cplm_megatron/model/layout.py's init_distributed)."""
    from cplm_megatron.parallel.cpu_compat import check_cuda_expected, require_compat

    env = env or detect_env()
    dp = check_world(env.world_size, parallel)
    if parallel.backend == "auto":  # an explicit gloo (e.g. CPU-side conversion) is a choice, not an accident
        check_cuda_expected()
    require_compat()  # applied by the entry point (cpu_compat.setup_compat), not here
    cuda = torch.cuda.is_available()
    backend = parallel.backend if parallel.backend != "auto" else ("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(minutes=parallel.timeout_minutes),
        )
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            tensor_model_parallel_size=parallel.tp,
            pipeline_model_parallel_size=parallel.pp,
            virtual_pipeline_model_parallel_size=parallel.vpp,
            context_parallel_size=parallel.cp,
        )
    set_seed(seed)
    return _rank_layout(parallel, env.rank, env.world_size, dp)


def _rank_layout(parallel: ParallelConfig, rank: int, world_size: int, dp: int) -> RankLayout:
    from megatron.core import parallel_state as ps

    cuda = torch.cuda.is_available()
    return RankLayout(
        rank=rank,
        world_size=world_size,
        tp=parallel.tp,
        pp=parallel.pp,
        dp=dp,
        vpp=parallel.vpp,
        sp=parallel.sp,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        dp_rank=ps.get_data_parallel_rank(),
        device=torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"),
        cp=parallel.cp,
    )


def rank_layout(parallel: ParallelConfig) -> RankLayout:
    """This process's place in the existing torch.distributed + Megatron parallel state (set up by
    `init_distributed` or `single_process_megatron`), which must have `parallel`'s sizes."""
    from megatron.core import parallel_state as ps

    if not (dist.is_initialized() and ps.model_parallel_is_initialized()):
        raise RuntimeError("no Megatron parallel state: call cplm_megatron.model.layout.init_distributed first "
                           "(or build inside `with single_process_megatron():` for one process)")
    have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size())
    want = (parallel.tp, parallel.pp, parallel.cp)
    if have != want:
        raise RuntimeError("Megatron's parallel state has tp, pp, cp = {}, {}, {} but the run asks for {}, {}, {}"
                           .format(*have, *want))
    world_size = dist.get_world_size()
    return _rank_layout(parallel, dist.get_rank(), world_size, check_world(world_size, parallel))


def destroy_distributed() -> None:
    """Tear down Megatron parallel state and the default process group."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
