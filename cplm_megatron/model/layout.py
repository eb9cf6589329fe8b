"""The parallel layout against the model, checked before any rendezvous, and the process groups set up for it.

`validate_layout` and `check_context_parallel` need no process group: a layout that does not fit the world
size or the model fails at once, naming the keys. `init_distributed` runs them, then sets up torch.distributed
and Megatron's parallel state (cplm_megatron/parallel/distributed.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Optional

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import ModelConfig
from cplm_megatron.parallel.config import ParallelConfig, check_world

if TYPE_CHECKING:  # the checks import no torch (config validation, the planner)
    from cplm_megatron.parallel.distributed import DistEnv, RankLayout


def init_distributed(parallel: ParallelConfig, model: ModelConfig, seed: int = 1234, env: Optional[DistEnv] = None
                     ) -> RankLayout:
    """Check the layout against the world and the model, then initialize torch.distributed and Megatron's
    parallel state for this process (parallel/distributed.py: init_process_groups)."""
    from cplm_megatron.parallel.distributed import detect_env, init_process_groups

    env = env or detect_env()
    validate_layout(env.world_size, parallel, model)
    return init_process_groups(parallel, seed, env)


@contextmanager
def single_process_megatron(model: Optional[ModelConfig] = None, seed: int = 1234, backend: str = "auto"
                            ) -> Iterator[None]:
    """Megatron parallel state for this one process (TP = PP = 1), for loading, scoring and converting
    checkpoints; whatever it creates (process group, parallel state) is torn down on exit, so a caller that
    set either up keeps it. `backend="gloo"` keeps a conversion on the CPU of a GPU machine."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from cplm_megatron.parallel.distributed import detect_env

    env = detect_env()
    if env.world_size != 1:
        raise ConfigError(f"this runs in one process, but WORLD_SIZE={env.world_size}; run it without torchrun/srun")
    created_state = not ps.model_parallel_is_initialized()
    created_group = not dist.is_initialized()
    if created_state:
        init_distributed(ParallelConfig(backend=backend), model or ModelConfig(), seed, env)
    try:
        yield
    finally:
        if created_state and ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if created_group and dist.is_initialized():
            dist.destroy_process_group()


def validate_layout(world_size: int, parallel: ParallelConfig, model: ModelConfig) -> int:
    """Check the layout against the model, then against the world (a TP that does not divide the heads is named
    as such whatever the number of processes); returns the data-parallel size."""
    parallel.validate()
    if model.num_attention_heads % parallel.tp:
        raise ConfigError(
            f"model.num_attention_heads={model.num_attention_heads} is not divisible by "
            f"parallel.tp={parallel.tp}"
        )
    if model.kv_heads % parallel.tp:
        raise ConfigError(
            f"KV heads (model.num_query_groups={model.kv_heads}) are not divisible by parallel.tp={parallel.tp}"
        )
    stages = parallel.pp * (parallel.vpp or 1)
    if model.num_layers % stages:
        raise ConfigError(
            f"model.num_layers={model.num_layers} is not divisible by parallel.pp={parallel.pp}"
            + (f" x parallel.vpp={parallel.vpp}" if parallel.vpp else "")
        )
    if model.padded_vocab_size % parallel.tp:
        raise ConfigError(
            f"padded vocab {model.padded_vocab_size} (model.vocab_size={model.vocab_size}, "
            f"model.vocab_pad_multiple={model.vocab_pad_multiple}) is not divisible by parallel.tp={parallel.tp}"
        )
    return check_world(world_size, parallel)


def check_context_parallel(parallel: ParallelConfig, model: ModelConfig, seq_len: int) -> None:
    """The context-parallel checks that need no process group: the load-balanced split cuts the sequence
    into 2 x parallel.cp chunks, and only SDPA's (or TE's) core attention attends across CP ranks (every copy
    kernel does: naive, chunked and fused, FP8 included)."""
    cp = parallel.cp
    if cp == 1:
        return
    if seq_len % (2 * cp):
        raise ConfigError(
            f"train.seq_len={seq_len} is not divisible by 2 x parallel.cp = {2 * cp} (context parallelism "
            f"splits the sequence into 2 x cp chunks); choose a seq_len that is a multiple of {2 * cp}"
        )
    if model.attention_impl == "megatron":
        raise ConfigError(
            f"parallel.cp={cp} needs model.attention_impl=sdpa (or te with Transformer Engine): megatron-core's "
            "unfused DotProductAttention has no context parallelism"
        )
    if parallel.pp > 1:
        raise ConfigError(
            f"parallel.cp={cp} with parallel.pp={parallel.pp} is refused: a PP=2 x CP=2 run of the tiny recipe trains "
            "to other losses than CP=1 from its first step (not yet explained); use parallel.tp/cp/dp with pp=1"
        )
