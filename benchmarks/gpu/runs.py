"""The training runs of the GPU check, by group, torch-free (the summary imports it from the EXIT trap).

A run is one `pretrain/pretrain_cplm.py` launch on synthetic data (bf16, SDPA, no checkpoints): its shape slot
(the model, sequence length, micro-batch, micro-batches per step), baseline or CPLM, the LM-head loss path and,
in the perf matrix, the levers it turns (`model.compile`, the optimizer's fused step, ...). Every run of a group
trains in one process (benchmarks/gpu/train_runs.py), so the 10-15 s of importing megatron-core and starting CUDA
is paid once per group, not once per run. The dry run trains the tiny preset at tiny sizes instead, with the fused
AdamW and (where a run asks for it) the fused LM-head loss in the Triton interpreter: the CUDA defaults, on CPU.
The micro-batch is the device's (train_runs.py: the largest the planner, with its measured margin, fits in the
device's memory less a reserve; on an H100 the 1.7B/4k slot trains micro-batch 2, the same 16 sequences per step).

Groups: `check`, the default pass (what users run: SmolLM2-135M, and the 1.7B at seq 4096 with four micro-batches
per step, where the copy head's overhead is read, each with the recipes' defaults), and `perf`, the lever matrix:
each lever turned alone at 135M (`model.compile`, `model.fused_swiglu`, the optimizer's fused step off, the
LM-head loss path), all levers together at 135M and at the 1.7B/4k accumulation point, and the earlier
chunked-loss rows. The runs whose name says `profile` end with two steps under torch.profiler
(`train.profile_steps`: kernel launches per step, matmul share; the summary's step times leave those steps out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Shape:
    """A slot's model and batch: preset, sequence length, micro-batch, global batch (one rank), iterations."""

    preset: str
    seq_len: int
    micro_batch: int
    global_batch: int
    iters: int

    @property
    def micro_batches_per_step(self) -> int:
        return self.global_batch // self.micro_batch


# slot: (on the GPU, in the CPU dry run). Iterations: enough steps after the summary's warm-up ones (3 on the GPU)
# for a stable mean; the 1.7B/4k steps take ~1.75 s each on an H200. The dry run's slots share one layer shape, so
# a compiled layer is compiled once (inductor's cache) whatever slot it trains in.
SHAPES: Dict[str, Tuple[Shape, Shape]] = {
    "small": (Shape("smollm2-135m", 2048, 8, 8, 20), Shape("tiny", 64, 2, 2, 4)),
    "large": (Shape("smollm2-1.7b", 2048, 2, 2, 10), Shape("tiny", 64, 2, 2, 4)),
    "large_4k": (Shape("smollm2-1.7b", 4096, 4, 16, 8), Shape("tiny", 64, 2, 4, 4)),
}
SLOT_TITLES = {"small": "SmolLM2-135M, seq 2048, micro 8", "large": "SmolLM2-1.7B, seq 2048, micro 2",
               "large_4k": "SmolLM2-1.7B, seq 4096, micro 4, four micro-batches per step"}


@dataclass(frozen=True)
class TrainRun:
    """One training run of the check (its files: `run_stem`)."""

    slot: str
    variant: str  # base | cplm
    loss: str  # model.lm_head_loss
    levers: Tuple[Tuple[str, str], ...] = ()  # (config key, value) the perf matrix turns
    tag: str = ""  # names the lever setting in the run's name
    profile: bool = False  # the last two steps under torch.profiler (train.profile_steps)

    @property
    def name(self) -> str:
        return "_".join(p for p in (self.slot, self.variant, self.loss, self.tag) if p)

    @property
    def key(self) -> str:
        """The run's key inside its slot in summary.json."""
        return "_".join(p for p in (self.variant, self.loss, self.tag) if p)

    def profile_steps(self, dry_run: bool) -> Tuple[int, int] | None:
        """The iterations profiled (the last two), or None."""
        iters = shape(self, dry_run).iters
        return (iters - 1, iters) if self.profile else None


CHECK: List[TrainRun] = [
    TrainRun("large_4k", "base", "auto"), TrainRun("large_4k", "cplm", "auto"),
    TrainRun("small", "base", "auto"), TrainRun("small", "cplm", "auto"),
]
COMPILE = (("model.compile", "true"),)
FUSED_SWIGLU = (("model.fused_swiglu", "true"),)
ALL_LEVERS = COMPILE + FUSED_SWIGLU
# The lever matrix, the most wanted first: each lever alone against the slot's `base_auto` of the same pass.
PERF: List[TrainRun] = [
    TrainRun("small", "base", "auto", profile=True),
    TrainRun("small", "base", "auto", COMPILE, "compile", profile=True),
    TrainRun("small", "base", "auto", FUSED_SWIGLU, "fused_swiglu"),
    TrainRun("small", "base", "auto", (("optimizer.fused", "false"),), "unfused_adam"),
    TrainRun("small", "base", "auto", ALL_LEVERS, "levers", profile=True),
    TrainRun("small", "cplm", "auto", ALL_LEVERS, "levers"),
    TrainRun("small", "base", "fused"), TrainRun("small", "base", "chunked"),
    TrainRun("large_4k", "base", "auto", profile=True),
    TrainRun("large_4k", "base", "auto", ALL_LEVERS, "levers", profile=True),
    TrainRun("large_4k", "cplm", "auto", ALL_LEVERS, "levers"),
    TrainRun("large_4k", "base", "fused"),
    TrainRun("large", "base", "chunked"), TrainRun("large", "cplm", "chunked"),
]
GROUPS: Dict[str, List[TrainRun]] = {"check": CHECK, "perf": PERF}
COMMON = ("model.attention_impl=sdpa", "data.synthetic=copy", "data.document_masking=false", "train.tokens=null",
          "train.log_interval=1", "train.eval_interval=0", "schedule.warmup_iters=2", "checkpoint.enabled=false",
          "optimizer.distributed=false", "optimizer.overlap_grad_reduce=false",
          "optimizer.overlap_param_gather=false", "logging.wandb=false", "precision.dtype=bf16",
          "parallel.timeout_minutes=2")


def shape(run: TrainRun, dry_run: bool) -> Shape:
    """The run's shape on the GPU or in the dry run."""
    return SHAPES[run.slot][1 if dry_run else 0]


def overrides(run: TrainRun, dry_run: bool, run_dir: str, micro_batch: Optional[int] = None) -> List[str]:
    """The run's `--set` overrides of configs/smollm2_135m.yaml; `micro_batch`: the one the device holds (train_runs.py
    chooses it by the device's memory; default the shape's). The dry run trains the defaults that only run on CUDA
    on the CPU: the fused AdamW (`optimizer.fused=true`, unless the run sets it) and the fused LM-head loss (the
    runs that ask for it, in the Triton interpreter)."""
    s = shape(run, dry_run)
    out = [f"run.dir={run_dir}", f"model.preset={s.preset}", f"model.lm_head_loss={run.loss}",
           f"copy_head.enabled={'true' if run.variant == 'cplm' else 'false'}", f"train.iters={s.iters}",
           f"train.seq_len={s.seq_len}", f"train.micro_batch={micro_batch or s.micro_batch}",
           f"train.global_batch={s.global_batch}", *COMMON]
    if s.seq_len > 2048:
        out.append(f"model.max_position_embeddings={s.seq_len}")
    profiled = run.profile_steps(dry_run)
    if profiled:
        out.append(f"train.profile_steps=[{profiled[0]},{profiled[1]}]")
    if dry_run and "optimizer.fused" not in dict(run.levers):
        out.append("optimizer.fused=true")
    return out + [f"{key}={value}" for key, value in run.levers]


def run_stem(group: str, run: TrainRun) -> str:
    """The stem of a run's files in the check's work dir: train_<group>_<name>."""
    return f"train_{group}_{run.name}"


def group_runs(group: str, slots: Optional[Sequence[str]] = None) -> List[TrainRun]:
    """The runs of a group (those of `slots` only, if given), in the order they train (the most wanted first: a
    budget cut loses the last)."""
    return [run for run in GROUPS[group] if slots is None or run.slot in slots]
