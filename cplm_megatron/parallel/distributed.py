"""Process-group and Megatron parallel-state setup from torchrun or SLURM environments.

`init_process_groups` (called by cplm_megatron/model/layout.py's `init_distributed`, which checks the layout
against the model first, so a bad layout fails before any rendezvous) refuses to fall back to CPU where GPUs
were promised, checks that the entry point applied the megatron-core patch layer (megatron_patches.setup_compat), picks
nccl on CUDA and gloo on CPU,
initializes Megatron's parallel state (tp, pp, virtual pp, sp; dp derived) and seeds every RNG the
way Megatron-LM does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from cplm_megatron.parallel.config import ParallelConfig, check_world
from cplm_megatron.parallel.env import (  # noqa: F401 - re-exported: the launcher's environment is read in env.py
    DistEnv,
    detect_env,
    expand_hostlist,
    free_port,
    master_port_for_job,
)


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
    from cplm_megatron.parallel.megatron_patches import check_cuda_expected, require_compat

    env = env or detect_env()
    dp = check_world(env.world_size, parallel)
    if parallel.backend == "auto":  # an explicit gloo (e.g. CPU-side conversion) is a choice, not an accident
        check_cuda_expected()
    require_compat()  # applied by the entry point (megatron_patches.setup_compat), not here
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
