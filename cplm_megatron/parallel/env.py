"""Where this process sits in the job, as its launcher (torchrun, srun, or none) told it through the environment;
reading it imports no torch (the trainer's --print-config and --check read the world size this way)."""
from __future__ import annotations

import os
import random
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional


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
