"""The `parallel.*` config section and its check against the world size (the checks against the model are
cplm_megatron/model/layout.py's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from cplm_megatron.errors import ConfigError


@dataclass
class ParallelConfig:
    """The `parallel.*` section: model-parallel sizes; data parallelism is what remains."""

    tp: int = 1
    pp: int = 1
    vpp: Optional[int] = None  # virtual pipeline stages (model chunks) per pipeline rank
    sp: bool = False
    cp: int = 1
    backend: str = "auto"  # auto | nccl | gloo
    timeout_minutes: int = 30

    def validate(self) -> None:
        for name in ("tp", "pp", "cp", "timeout_minutes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if self.vpp is not None and (self.vpp < 1 or self.pp < 2):
            raise ConfigError(f"parallel.vpp={self.vpp} needs parallel.pp >= 2 (got pp={self.pp}) and vpp >= 1")
        if self.sp and self.tp < 2:
            raise ConfigError("parallel.sp=true needs parallel.tp >= 2 (sequence parallelism shards over TP)")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ConfigError(f"parallel.backend must be auto|nccl|gloo, got {self.backend!r}")


def check_world(world_size: int, parallel: ParallelConfig) -> int:
    """Check the parallel sizes against the number of processes; returns the data-parallel size."""
    parallel.validate()
    mp = parallel.tp * parallel.pp * parallel.cp
    if world_size % mp:
        raise ConfigError(
            f"world size {world_size} is not divisible by parallel.tp*parallel.pp*parallel.cp = "
            f"{parallel.tp}*{parallel.pp}*{parallel.cp} = {mp}; change the layout or the number of processes"
        )
    return world_size // mp
