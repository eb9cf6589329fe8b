"""The run config: one dataclass per concern, composed; loaded from YAML + `--set section.key=value`. The
sections of the model, data and parallel layout live with their packages; the training sections (run, train,
optimizer, schedule, checkpoint, logging) here, below every package that reads a run's config (the trainer, the
checkpoints, the evaluators and the converters).

    cfg = load_run_config("configs/tiny.yaml", ["parallel.tp=2", "train.iters=50", "run.dir=runs/x"])

Unknown keys and invalid combinations are `ConfigError`s that name the key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence

import yaml

from cplm_megatron.config.loader import build_dataclass, load_tree, resolve_model_section, to_dict
from cplm_megatron.data.config import BatchShape, DataConfig
from cplm_megatron.errors import ConfigError
from cplm_megatron.model.compile import check_compile
from cplm_megatron.model.config import (
    CopyHeadConfig,
    ModelConfig,
    PrecisionConfig,
    RecomputeConfig,
)
from cplm_megatron.model.layout import check_context_parallel, validate_layout
from cplm_megatron.parallel.config import ParallelConfig

# The batch shape's one home is train.*; the loaders receive it as a BatchShape (TrainConfig.shape).
_BATCH_KEYS = ("seq_len", "micro_batch", "global_batch")


@dataclass
class OptimizerConfig:
    """The `optimizer.*` section (AdamW via Megatron's optimizer wrappers; the LR is train.lr)."""

    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip_grad: float = 1.0
    distributed: bool = False  # Megatron's distributed optimizer (ZeRO-1 over data parallel)
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    bucket_size: Optional[int] = None
    # Fraction of this rank's optimizer shard (fp32 master weights + Adam moments) kept and stepped on
    # the CPU: megatron-core's HybridDeviceOptimizer (`optimizer_cpu_offload`). GPU + Transformer Engine.
    offload_fraction: float = 0.0
    # torch's fused AdamW kernel (one pass over parameters, gradients and moments) where megatron-core falls back
    # to torch's AdamW (no Apex, no Transformer Engine; their FusedAdam is fused already). auto: fused on CUDA;
    # false: torch's default (foreach on CUDA, a per-parameter loop on CPU). The same update to rounding.
    fused: Literal["auto", True, False] = "auto"  # torch's fused AdamW kernel; auto: on CUDA (no Apex/TE only)

    def validate(self) -> None:
        for key in ("weight_decay", "clip_grad"):
            if getattr(self, key) < 0:
                raise ConfigError(f"optimizer.{key} must be >= 0, got {getattr(self, key)}")
        if self.eps <= 0:
            raise ConfigError(f"optimizer.eps must be > 0, got {self.eps}")
        for key in ("beta1", "beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ConfigError(f"optimizer.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.overlap_param_gather and not self.distributed:
            raise ConfigError("optimizer.overlap_param_gather=true needs optimizer.distributed=true")
        if not 0.0 <= self.offload_fraction <= 1.0:
            raise ConfigError(f"optimizer.offload_fraction must be in [0, 1], got {self.offload_fraction}")
        if self.offload_fraction and not self.distributed:
            raise ConfigError("optimizer.offload_fraction > 0 offloads the distributed optimizer's shard: "
                              "set optimizer.distributed=true")


@dataclass
class ScheduleConfig:
    """The `schedule.*` section: warmup then cosine, or warmup-stable-decay (WSD)."""

    style: Literal["wsd", "cosine", "linear", "constant"] = "wsd"
    warmup_iters: int = 0
    decay_iters: Optional[int] = None  # cosine/linear: iterations to decay over (default: train.iters)
    wsd_decay_fraction: float = 0.2  # WSD: final fraction of training spent decaying
    wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "linear"

    def validate(self) -> None:
        if self.warmup_iters < 0:
            raise ConfigError(f"schedule.warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.decay_iters is not None and self.decay_iters < 1:
            raise ConfigError(f"schedule.decay_iters must be >= 1 or null, got {self.decay_iters}")
        if not 0.0 < self.wsd_decay_fraction <= 1.0:
            raise ConfigError(f"schedule.wsd_decay_fraction must be in (0, 1], got {self.wsd_decay_fraction}")


def check_profile_steps(steps: Sequence[int], iters: Optional[int] = None, length: str = "") -> None:
    """`train.profile_steps` is [first, last] with 1 <= first <= last (<= `iters`, the run's last iteration, which
    `length` names: a profile past it would be empty or cut short)."""
    if len(steps) != 2 or not 1 <= steps[0] <= steps[1]:
        raise ConfigError(f"train.profile_steps must be [first, last] iterations with 1 <= first <= last, got "
                          f"{list(steps)} (e.g. --set train.profile_steps=[5,8])")
    if iters is not None and steps[1] > iters:
        first = max(1, min(steps[0], iters - 1))
        raise ConfigError(f"train.profile_steps={list(steps)} goes past the run's last iteration ({length}): choose "
                          f"iterations within 1..{iters}, e.g. --set train.profile_steps=[{first},{iters}]")


@dataclass
class RunSection:
    """The `run.*` section."""

    dir: str = "runs/default"
    name: str = ""
    seed: int = 1234
    check_memory: bool = True  # refuse a model the planner says does not fit the device/host (preflight)

    def validate(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"run.seed must be in [0, 2**32), got {self.seed}")
        if not str(self.dir).strip():
            raise ConfigError("run.dir is empty: name the run's directory, e.g. --set run.dir=runs/my_run")


@dataclass
class TrainConfig:
    """The `train.*` section: length, batch shape, cadence, failure policy."""

    iters: Optional[int] = None
    tokens: Optional[int] = None  # alternative to iters: train until this many tokens
    micro_batch: int = 4
    global_batch: int = 32
    seq_len: int = 256
    lr: float = 3e-4  # peak learning rate (after warmup)
    min_lr: float = 3e-5  # floor of the decay
    log_interval: int = 10
    eval_interval: int = 0  # 0: no periodic validation
    eval_iters: int = 4  # validation micro-batches per data-parallel rank per evaluation
    max_nonfinite_steps: int = 5  # abort after this many non-finite losses in a row
    exit_after_iters: Optional[int] = None  # stop (with a checkpoint) after this many iterations of this launch
    profile_steps: Optional[List[int]] = None  # [first, last] iterations to profile into RUN_DIR/profile.json
    probe_interval: int = 0  # copy accuracy, in-context score into metrics.jsonl (evaluation/probes.py); 0: off
    probe_sequences: int = 32  # copy-task sequences per probe
    probe_copy_length: int = 128  # tokens per copy-task sequence (a span and its repeat)

    def validate(self) -> None:
        if (self.iters is None) == (self.tokens is None):
            raise ConfigError("set exactly one of train.iters and train.tokens")
        for key in ("iters", "tokens", "exit_after_iters"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"train.{key} must be >= 1, got {value}")
        self.shape.validate()
        for key in ("log_interval", "eval_iters", "max_nonfinite_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1, got {getattr(self, key)}")
        if self.eval_interval < 0:
            raise ConfigError(f"train.eval_interval must be >= 0, got {self.eval_interval}")
        if self.probe_interval < 0:
            raise ConfigError(f"train.probe_interval must be >= 0, got {self.probe_interval}")
        if self.probe_interval and (self.probe_sequences < 1 or self.probe_copy_length < 8):
            raise ConfigError(f"train.probe_sequences must be >= 1 and train.probe_copy_length >= 8 (got "
                              f"{self.probe_sequences}, {self.probe_copy_length})")
        if self.profile_steps is not None:
            check_profile_steps(self.profile_steps)
        if self.lr <= 0 or not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"train.lr/min_lr must satisfy lr > 0 and 0 <= min_lr <= lr (got {self.lr}/{self.min_lr})")

    @property
    def shape(self) -> BatchShape:
        """The batch shape, as the data loaders take it."""
        return BatchShape(self.seq_len, self.micro_batch, self.global_batch)

    def check_length(self) -> None:
        """A launch's check of its ranges against the run's length (not a saved config's: a checkpoint written
        before it stays readable): profile steps past the last iteration."""
        if self.profile_steps is not None:
            length = f"train.iters={self.iters}" if self.iters is not None else \
                f"train.tokens={self.tokens}: {self.total_iters()} iterations"
            check_profile_steps(self.profile_steps, self.total_iters(), length)

    def total_iters(self) -> int:
        """train.iters, or train.tokens converted with the global batch."""
        if self.iters is not None:
            return self.iters
        per_step = self.global_batch * self.seq_len
        return -(-int(self.tokens) // per_step)


@dataclass
class CheckpointConfig:
    """The `checkpoint.*` section (torch_dist checkpoints under run.dir/checkpoints)."""

    enabled: bool = True  # false: never save (throughput benchmarks); a signal then just stops the run
    interval: int = 0  # 0: only at the end and on signals
    keep: int = 2  # keep the newest N complete checkpoints
    async_save: bool = False
    load: Optional[str] = None  # initialize from this checkpoint dir when run.dir has none (fine-tune/convert)
    load_optimizer: bool = True  # with `load`: also restore optimizer/scheduler/data state
    resume: bool = True  # auto-resume from run.dir/checkpoints/latest
    overwrite: bool = False  # with resume=false: delete run.dir's existing checkpoints (else refused)

    def validate(self) -> None:
        if self.interval < 0:
            raise ConfigError(f"checkpoint.interval must be >= 0, got {self.interval}")
        if self.keep < 1:
            raise ConfigError(f"checkpoint.keep must be >= 1, got {self.keep}")
        if self.overwrite and self.resume:
            raise ConfigError("checkpoint.overwrite=true deletes run.dir's checkpoints to start over: it needs "
                              "checkpoint.resume=false as well")


@dataclass
class LoggingConfig:
    """The `logging.*` section."""

    tensorboard: bool = False  # TensorBoard event files in run.dir/tensorboard
    wandb: bool = True
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_project: str = "cplm-megatron"
    wandb_entity: Optional[str] = None
    peak_tflops: Optional[float] = None  # per-device peak for MFU; None: by GPU model (CPU: 1.0 nominal)

    def validate(self) -> None:
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ConfigError(f"logging.peak_tflops must be > 0 or null, got {self.peak_tflops}")
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("logging.tensorboard=true needs the tensorboard package: pip install tensorboard, or "
                              "set logging.tensorboard=false")


@dataclass
class RunConfig:
    """Everything a training run needs."""

    run: RunSection = field(default_factory=RunSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    copy_head: CopyHeadConfig = field(default_factory=CopyHeadConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(iters=100))
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        check_finite(self)
        if self.train.seq_len > self.model.max_position_embeddings:
            raise ConfigError(
                f"train.seq_len={self.train.seq_len} exceeds model.max_position_embeddings="
                f"{self.model.max_position_embeddings}"
            )
        if self.data.document_masking and self.model.layer_spec == "te":
            raise ConfigError("data.document_masking=true needs model.layer_spec=local (explicit attention masks)")
        check_context_parallel(self.parallel, self.model, self.train.seq_len)
        check_compile(self.model, self.parallel, self.recompute.granularity)
        if self.train.probe_interval and (self.parallel.pp > 1 or self.parallel.cp > 1):
            raise ConfigError("train.probe_interval needs parallel.pp=1 and parallel.cp=1 (the probe scores the "
                              "model's full distribution in one stage); set train.probe_interval=0 or evaluate "
                              "checkpoints with tools/evaluate.py --all-checkpoints")
        if self.copy_head.fp8 and self.precision.dtype == "fp32":
            raise ConfigError("copy_head.fp8=true needs precision.dtype=bf16")

    def validate_world(self, world_size: int) -> int:
        """A launch's checks, run before any process group starts: the run's ranges against its length, and those
        that need the number of processes (layout vs model, global batch vs micro batch x DP); returns the
        data-parallel size."""
        self.train.check_length()
        dp = validate_layout(world_size, self.parallel, self.model)
        self.train.shape.num_microbatches(dp)
        return dp

    def to_dict(self) -> Dict[str, Any]:
        """Plain nested dict (what config.yaml and a checkpoint record)."""
        return to_dict(self)

    def hash(self) -> str:
        """Short hash of the resolved config (for scaling-study records)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def check_finite(section: Any, prefix: str = "") -> None:
    """Every number of a config (dataclasses, lists and dicts of them) is finite: `.inf` or `.nan` in a recipe or
    an override is a ConfigError naming the key (a learning rate of inf trained NaN weights and exited 0)."""
    if dataclasses.is_dataclass(section):
        items = [(f.name, getattr(section, f.name)) for f in dataclasses.fields(section)]
    elif isinstance(section, dict):
        items = list(section.items())
    elif isinstance(section, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(section)]
    else:
        return
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value}")
        check_finite(value, key)


def _check_batch_keys(tree: Dict[str, Any]) -> None:
    data = tree.get("data") or {}
    for key in _BATCH_KEYS:
        if key in data:
            raise ConfigError(f"data.{key} is set by train.{key}; remove data.{key} and set train.{key}")


def run_config_from_saved(tree: Dict[str, Any]) -> RunConfig:
    """The RunConfig of a config a checkpoint saved. Configs written while the data section carried a copy of
    the batch shape may repeat train.{seq_len, micro_batch, global_batch} under data.*; the copy is dropped."""
    tree = dict(tree)
    tree["data"] = {k: v for k, v in (tree.get("data") or {}).items() if k not in _BATCH_KEYS}
    return build_run_config(tree)


def build_run_config(tree: Dict[str, Any]) -> RunConfig:
    """RunConfig from a nested dict (already merged with overrides)."""
    tree = dict(tree)
    _check_batch_keys(tree)
    if "model" in tree:
        if not isinstance(tree["model"], dict):
            raise ConfigError(f"model: expected a mapping, got {tree['model']!r}")
        tree["model"] = resolve_model_section(tree["model"])
    return build_dataclass(RunConfig, tree)


# Keys that are alternatives to each other: overriding one replaces the recipe's other.
_ALTERNATIVE_KEYS = {("train", "iters"): ("train", "tokens"), ("train", "tokens"): ("train", "iters")}


def load_run_config(path: Optional[str], overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML recipe (a file, or a shipped recipe's name: `tiny`; or start empty), apply dotted overrides,
    build and validate. An override of train.iters replaces a recipe's train.tokens (and the other way round),
    so `--set train.iters=1000` works on a recipe that trains by tokens."""
    return build_run_config(load_tree(path, overrides, _ALTERNATIVE_KEYS))


def dump_run_config(cfg: RunConfig, path: Path, resolved: Optional[Dict[str, str]] = None) -> None:
    """Write the config as YAML (what the run was given); `resolved`: {dotted key: what its setting, e.g. `auto`,
    resolved to in this launch}, a comment beside the key (a relaunch elsewhere resolves it anew)."""
    from cplm_megatron.durable_files import write_atomic

    lines, section = yaml.safe_dump(cfg.to_dict(), sort_keys=False).splitlines(), ""
    for i, line in enumerate(lines):
        section = line[:-1] if not line.startswith(" ") and line.endswith(":") else section
        key = f"{section}.{line.strip().split(':', 1)[0]}" if line.startswith("  ") and line[2:3] != " " else ""
        if key in (resolved or {}):
            lines[i] = f"{line}  # resolved to {resolved[key]} in this launch"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(lines) + "\n")  # a full disk leaves the previous one


def overrides_from_args(items: Optional[List[str]]) -> List[str]:
    """Flatten `--set a=1 b=2 --set c=3` argparse results."""
    out: List[str] = []
    for group in items or []:
        out.extend(group if isinstance(group, list) else [group])
    return out
