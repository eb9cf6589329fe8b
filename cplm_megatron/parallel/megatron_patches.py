"""The megatron-core patch layer: the only place where megatron-core is patched.

megatron-core assumes CUDA (and Apex or Transformer Engine). Each patch below names the megatron-core
code it replaces and why (docs/contributing.md "The megatron-core patch layer" lists what each fixes). Two scopes:

* ``cpu``            — applied only when CUDA is absent (``torch.cuda.is_available()`` is False);
                       these never touch a GPU run.
* ``torch_fallback`` — fixes for megatron-core bugs on its own fallback path for installs without
                       Apex and Transformer Engine (torch Adam, torch norms); applied whenever neither
                       is importable, on GPU machines too (an H200 image without TE takes this path).

A patch may also depend on the megatron-core version (``Patch.needed``): it is applied only where the
code it replaces exists. ``apply_compat()`` is idempotent (each patch marks what it patched) and
returns the patch names in effect; ``describe_compat()`` turns them into the line rank 0 logs where verbose
(``CPLM_VERBOSE=1``, pretrain's ``--verbose``). The
entry points apply the layer (``setup_compat()``, one call each); ``init_process_groups`` only checks
that it was (``require_compat()``). Tests apply all patches but one in a fresh process to show each one
is needed.

``check_cuda_expected()`` guards the CPU path itself: where the environment promises GPUs but CUDA
is unusable, falling back to CPU over gloo would go unnoticed for hours, so it is an error.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import pickle
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Dict, Iterable, List, Mapping, Optional

import torch

from cplm_megatron.errors import UserError

SCOPES = {
    "cpu": "CPU patches (CUDA absent)",
    "torch_fallback": "fixes for megatron-core's no-Apex/TE fallback path (GPU machines without Apex/TE too)",
}
ALLOW_CPU_ENV = "CPLM_ALLOW_CPU"

_MARK = "__cplm_compat__"


@dataclass(frozen=True)
class Patch:
    """One named patch of megatron-core."""

    name: str
    replaces: str
    scope: str  # a key of SCOPES
    apply: Callable[[], None]
    needed: Callable[[], bool] = lambda: True  # False on megatron-core versions without the code it fixes


def _mark(obj: object, name: str) -> bool:
    """Record that patch `name` touched `obj`; False if it already had."""
    done = getattr(obj, _MARK, set())
    if name in done:
        return False
    setattr(obj, _MARK, done | {name})
    return True


# --- 1 ---------------------------------------------------------------------------------------------
def _patch_rng_tracker() -> None:
    import megatron.core.tensor_parallel.random as mr

    if not _mark(mr, "rng_tracker"):
        return

    def get_state(device="cuda", clone=False, graph_safe=False):  # noqa: ARG001 - mcore signature
        return torch.get_rng_state()

    def set_state(new_state, device=-1, graph_safe=False):  # noqa: ARG001 - mcore signature
        torch.set_rng_state(new_state)

    class CpuRNGStatesTracker(mr.CudaRNGStatesTracker):
        """CudaRNGStatesTracker semantics on the CPU default generator."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            orig = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)

        @contextlib.contextmanager
        def fork(self, name=mr._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    mr._get_cuda_rng_state = get_state
    mr._set_cuda_rng_state = set_state
    # initialize_rng_tracker() looks the class up by its module-global name
    mr.CudaRNGStatesTracker = CpuRNGStatesTracker


# --- 2 ---------------------------------------------------------------------------------------------
def _patch_current_device() -> None:
    if not _mark(torch.cuda, "current_device"):
        return
    torch.cuda.current_device = lambda: "cpu"


# --- 4 ---------------------------------------------------------------------------------------------
def _to_cpu_device(d):
    if isinstance(d, str) and d.startswith("cuda"):
        return "cpu"
    if isinstance(d, torch.device) and d.type == "cuda":
        return torch.device("cpu")
    return d


class CudaToCpuMode(torch.overrides.TorchFunctionMode):
    """Rewrites mcore's scattered CUDA placement (device="cuda", .cuda(), pin_memory=True) to CPU and
    answers `param.type()` with the CUDA type names mcore compares against.

    This also covers transformer/utils.py's causal masks (`torch.ones(..., device="cuda")`), which the
    reference shim patched separately."""

    _IDENTITY = (torch.Tensor.cuda, torch.Tensor.pin_memory)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self._IDENTITY:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0],) + tuple(_to_cpu_device(a) for a in args[1:])
        return func(*args, **kwargs)


def _patch_cuda_placement() -> None:
    if not _mark(torch.overrides, "cuda_placement"):
        return
    CudaToCpuMode().__enter__()  # process-wide (main thread) for the rest of the run


# --- 5 ---------------------------------------------------------------------------------------------
def _patch_synchronize() -> None:
    if _mark(torch.cuda, "synchronize"):
        torch.cuda.synchronize = lambda *a, **k: None


# --- 6 ---------------------------------------------------------------------------------------------
def _patch_distopt_missing_state_keys() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as DO

    if not _mark(DO, "missing_state_keys"):
        return
    original = DO._set_main_param_and_optimizer_states

    def set_states_skip_missing(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original(self, model_param, tensors)
        gi, go = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[gi]["params"][go]
        dst = {"param": main_param, **self.optimizer.state[main_param]}
        for key, value in dst.items():
            if key in tensors and torch.is_tensor(value) and torch.is_tensor(tensors[key]):
                value.copy_(tensors[key])

    DO._set_main_param_and_optimizer_states = set_states_skip_missing


# --- 7 ---------------------------------------------------------------------------------------------
def _patch_distopt_shared_step() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as DO

    if not _mark(DO, "shared_step"):
        return
    original = DO.load_state_dict

    def load_state_dict_unaliased_step(self, state_dict):
        out = original(self, state_dict)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
        return out

    DO.load_state_dict = load_state_dict_unaliased_step


# --- 8 ---------------------------------------------------------------------------------------------
def _patch_torch_norm_sequence_parallel() -> None:
    import megatron.core.transformer.torch_norm as tn

    if not _mark(tn.WrappedTorchNorm, "sp_norm"):
        return
    original = tn.WrappedTorchNorm.__new__

    def new_with_sp(cls, config, hidden_size, eps=1e-5, *args, **kwargs):
        sp = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original(cls, config, hidden_size, eps, *args, **kwargs)
        finally:
            config.sequence_parallel = sp
        if sp:  # finalize_model_grads all-reduces grads of params tagged sequence_parallel over TP
            for p in norm.parameters():
                p.sequence_parallel = True
        return norm

    tn.WrappedTorchNorm.__new__ = staticmethod(new_with_sp)


# --- 9 ---------------------------------------------------------------------------------------------
def _l2_norm_fp64(chunk_size, noop_flag, tensor_lists, per_tensor, *args):  # noqa: ARG001 - amp_C signature
    """amp_C.multi_tensor_l2norm contract (returns ([1] fp32 norm, None)) with fp64 accumulation."""
    squares = [t.detach().double().pow(2).sum() for tensors in tensor_lists for t in tensors]
    total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    return total.sqrt().float().reshape(1), None


def _patch_grad_norm_precision() -> None:
    import megatron.core.optimizer.clip_grads as cg
    from megatron.core.utils import local_multi_tensor_l2_norm

    if cg.l2_norm_impl is local_multi_tensor_l2_norm and _mark(cg, "grad_norm_precision"):
        cg.l2_norm_impl = _l2_norm_fp64


# --- 10 --------------------------------------------------------------------------------------------
def _grad_sync_calls_current_stream() -> bool:
    """megatron-core >= 0.18.2: DDP's bucket group fetches the current CUDA stream on every grad sync
    (to wait on CUDA-graph events); earlier releases only on a multi-instance path CPU runs never take."""
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucketGroup as G

    return "current_stream = torch.cuda.current_stream()" in inspect.getsource(G.start_grad_sync)


def _patch_current_stream() -> None:
    if _mark(torch.cuda, "current_stream"):
        torch.cuda.current_stream = lambda device=None: torch.cpu.current_stream()


# --- 11 --------------------------------------------------------------------------------------------
def _warns_without_tp_group() -> bool:
    """megatron-core's get_tensor_model_parallel_group_if_none warns when given no group, which the local spec's
    RowParallelLinear does on every forward (0.16.1 through 0.19.2 pass tp_group=None)."""
    from megatron.core.utils import get_tensor_model_parallel_group_if_none as f

    return "warnings.warn(" in inspect.getsource(inspect.unwrap(f))  # (unwrapped: the patch keeps __wrapped__)


def _patch_tp_group_warning() -> None:
    import sys

    import megatron.core.utils as mu

    if not _mark(mu, "tp_group_warning"):
        return
    original = mu.get_tensor_model_parallel_group_if_none

    @functools.wraps(original)
    def group_if_none(tp_group=None, is_expert=False, check_initialized=True):
        # torch.compile cannot trace warnings.warn with a warning class: one graph break per linear layer
        if tp_group is not None or not torch.compiler.is_compiling() or not torch.distributed.is_initialized():
            return original(tp_group, is_expert, check_initialized)
        ps = mu.parallel_state
        if not ps.is_initialized():
            return tp_group
        get = ps.get_expert_tensor_parallel_group if is_expert else ps.get_tensor_model_parallel_group
        return get(check_initialized=check_initialized)

    for module in list(sys.modules.values()):  # every module that imported the function by name
        if getattr(module, "__name__", "").startswith("megatron.core") and \
                getattr(module, "get_tensor_model_parallel_group_if_none", None) is original:
            module.get_tensor_model_parallel_group_if_none = group_if_none


# --- 12 --------------------------------------------------------------------------------------------
def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):  # noqa: ARG001 - amp_C signature
    """amp_C.multi_tensor_l2norm's contract (([1] fp32 norm, None)) in two multi-tensor kernels and no host sync
    (megatron-core's local version reads every tensor's norm back to the host: one device sync per tensor)."""
    tensors = [t for tensors in tensor_lists for t in tensors]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32, device=noop_flag.device), None
    norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack(norms).float()).reshape(1), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):  # noqa: ARG001 - amp_C signature
    """amp_C.multi_tensor_scale's contract (dst = src * scale) as multi-tensor ops, not two kernels per tensor."""
    src, dst = tensor_lists
    if not src:
        return
    if all(a is b for a, b in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
    elif scale == 1.0:
        torch._foreach_copy_(dst, src)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def _foreach_copy_this_to_that(this, that, overflow_buf=None):  # noqa: ARG001 - megatron-core signature
    """optimizer._multi_tensor_copy_this_to_that (fp32 main params -> 16-bit model params) as one foreach copy."""
    if this:
        torch._foreach_copy_(that, this)


def _local_multi_tensor_fallback() -> bool:
    """megatron-core took its local (per-tensor loop) multi-tensor ops: neither Apex's amp_C nor TE's."""
    import megatron.core.optimizer.optimizer as mo
    from megatron.core.utils import local_multi_tensor_scale

    return mo.multi_tensor_scale_impl in (local_multi_tensor_scale, foreach_scale)  # (or already patched)


def _patch_foreach_fallback() -> None:
    import megatron.core.optimizer.clip_grads as cg
    import megatron.core.optimizer.optimizer as mo
    from megatron.core.utils import local_multi_tensor_l2_norm, local_multi_tensor_scale

    if not _mark(mo, "foreach_fallback"):
        return
    if cg.l2_norm_impl is local_multi_tensor_l2_norm:  # (on CPU grad_norm_precision's fp64 version stays)
        cg.l2_norm_impl = foreach_l2_norm
    for module in (cg, mo):
        if module.multi_tensor_scale_impl is local_multi_tensor_scale:
            module.multi_tensor_scale_impl = foreach_scale
    mo._multi_tensor_copy_this_to_that = _foreach_copy_this_to_that


# --- results queue ---------------------------------------------------------------------------------
class PickledQueue:
    """megatron's write-results queue carrying pickled bytes: the Manager server that holds it stores them
    without unpickling (and so without importing) torch's checkpoint classes."""

    def __init__(self, queue) -> None:
        self._queue = queue

    def put(self, item) -> None:
        """Queue `item`, pickled here (in the writer)."""
        self._queue.put(pickle.dumps(item))

    def get(self, block: bool = True, timeout: Optional[float] = None):
        """The next item, unpickled here (in the trainer)."""
        return pickle.loads(self._queue.get(block, timeout))

    def get_nowait(self):
        """The next item without waiting (queue.Empty if none)."""
        return pickle.loads(self._queue.get_nowait())


_RESULTS_QUEUE_GETTERS = ("_get_write_results_queue", "get_write_results_queue")  # megatron-core 0.16, 0.19


def _results_queue_getter() -> Optional[str]:
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa

    return next((name for name in _RESULTS_QUEUE_GETTERS if callable(getattr(fa, name, None))), None)


def _patch_results_queue() -> None:
    from megatron.core.dist_checkpointing.strategies import filesystem_async as fa

    if not _mark(fa, "results_queue"):
        return
    name = _results_queue_getter()
    original = getattr(fa, name)

    def get_write_results_queue(*args, **kwargs):
        if not isinstance(fa._results_queue, PickledQueue):
            fa._results_queue = PickledQueue(original(*args, **kwargs))
        return fa._results_queue

    setattr(fa, name, get_write_results_queue)


PATCHES: List[Patch] = [
    Patch("rng_tracker", "tensor_parallel/random.py: CUDA RNG state get/set + CudaRNGStatesTracker",
          "cpu", _patch_rng_tracker),
    Patch("current_device", "torch.cuda.current_device() (rotary_pos_embedding get_emb, "
          "p2p_communication, utils GlobalMemoryBuffer) -> 'cpu'", "cpu", _patch_current_device),
    Patch("cuda_placement", "device='cuda', .cuda(), pin_memory=True, param.type()=='torch.cuda.*' "
          "across schedules, clip_grads, optimizer, distrib_optimizer, dist_checkpointing",
          "cpu", _patch_cuda_placement),
    Patch("synchronize", "torch.cuda.synchronize() -> no-op", "cpu", _patch_synchronize),
    Patch("missing_state_keys", "optimizer/distrib_optimizer.py "
          "DistributedOptimizer._set_main_param_and_optimizer_states: KeyError 'step' on load",
          "torch_fallback", _patch_distopt_missing_state_keys),
    Patch("shared_step", "optimizer/distrib_optimizer.py DistributedOptimizer.load_state_dict: one "
          "`step` tensor shared by all params (wrong Adam bias correction after resume)",
          "torch_fallback", _patch_distopt_shared_step),
    Patch("sp_norm", "transformer/torch_norm.py WrappedTorchNorm: asserts no sequence parallel",
          "torch_fallback", _patch_torch_norm_sequence_parallel),
    Patch("grad_norm_precision", "optimizer/clip_grads.py l2_norm_impl (utils.local_multi_tensor_l2_norm): "
          "torch.norm on CPU fp32 is off by ~1e-4 relative for large tensors, so the grad norm (and "
          "clipping) depended on the TP layout; accumulate in fp64", "cpu", _patch_grad_norm_precision),
    Patch("current_stream", "distributed/param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync: "
          "torch.cuda.current_stream() (waits on CUDA-graph events) -> torch.cpu.current_stream()",
          "cpu", _patch_current_stream, _grad_sync_calls_current_stream),
    Patch("tp_group_warning", "utils.get_tensor_model_parallel_group_if_none: warns on every RowParallelLinear "
          "forward (the local spec passes tp_group=None), a graph break per layer under torch.compile; no warning "
          "while compiling", "torch_fallback", _patch_tp_group_warning, _warns_without_tp_group),
    Patch("foreach_fallback", "utils.local_multi_tensor_l2_norm / local_multi_tensor_scale and optimizer."
          "_multi_tensor_copy_this_to_that: per-tensor loops (a host sync per tensor in the grad norm, two kernels "
          "per tensor to clip, one per parameter to copy main params to 16-bit ones) -> torch._foreach_* ops",
          "torch_fallback", _patch_foreach_fallback, _local_multi_tensor_fallback),
    Patch("results_queue", "dist_checkpointing/strategies/filesystem_async.py (_)get_write_results_queue: the "
          "Manager it spawns unpickles every save's write results, importing torch (~2.5 CPU-s on each process's "
          "first save; CI launches hundreds of trainers) -> the queue carries pickled bytes", "cpu",
          _patch_results_queue, lambda: _results_queue_getter() is not None),
]


def cuda_absent() -> bool:
    """True on machines where the ``cpu`` patches apply."""
    return not torch.cuda.is_available()


def apex_or_te_present() -> bool:
    """megatron-core's own test for its fused (Apex/TE) optimizer and norm path."""
    from megatron.core.optimizer import distrib_optimizer

    return bool(getattr(distrib_optimizer, "HAVE_APEX_OR_TE", False))


def active_scopes() -> List[str]:
    """The scopes that hold on this machine."""
    return [scope for scope, holds in (("cpu", cuda_absent()), ("torch_fallback", not apex_or_te_present()))
            if holds]


def apply_compat(skip: Iterable[str] = ()) -> List[str]:
    """Apply every patch whose scope holds on this machine and that this megatron-core needs (minus
    `skip`, and CPLM_COMPAT_SKIP=a,b); returns their names."""
    skip = set(skip) | set(filter(None, os.environ.get("CPLM_COMPAT_SKIP", "").split(",")))
    unknown = skip - {p.name for p in PATCHES}
    if unknown:
        raise ValueError(f"unknown compat patch(es) {sorted(unknown)}; known: {[p.name for p in PATCHES]}")
    scopes = set(active_scopes())
    applied = []
    for patch in PATCHES:
        if patch.scope in scopes and patch.name not in skip and patch.needed():
            patch.apply()
            applied.append(patch.name)
    _APPLIED[:] = [applied]
    return applied


_APPLIED: List[List[str]] = []  # [the names apply_compat applied] once it ran in this process (or its parent)


def setup_compat() -> List[str]:
    """An entry point's one call before it creates process groups (pretrain, evaluate, the HF converters,
    model_info, the benchmarks, the test harness's workers): `apply_compat()`, and rank 0 (RANK or
    SLURM_PROCID, default 0) logs `describe_compat`'s line on stderr where verbose (CPLM_VERBOSE=1, `--verbose`;
    tools print JSON on stdout)."""
    from cplm_megatron.entry_points import info

    applied = apply_compat()
    if int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
        info(describe_compat(applied))
    return applied


def require_compat() -> None:
    """Raise if this process creates process groups before its entry point applied the layer."""
    if not _APPLIED:
        raise RuntimeError("the megatron-core patch layer is not applied in this process: call "
                           "cplm_megatron.parallel.megatron_patches.setup_compat() in the entry point, before "
                           "creating process groups (init_distributed, single_process_megatron)")


def describe_compat(applied: Iterable[str]) -> str:
    """One log line: the megatron-core version and the applied patches by scope."""
    applied = set(applied)
    parts = []
    for scope, title in SCOPES.items():
        names = [p.name for p in PATCHES if p.scope == scope and p.name in applied]
        if names:
            parts.append(f"{title}: {', '.join(names)}")
    return f"[compat] megatron-core {metadata.version('megatron-core')}; " + ("; ".join(parts) or "no patches applied")


def gpus_expected(env: Mapping[str, str]) -> Dict[str, str]:
    """The variables by which the launcher promises GPUs to this process (empty if none does)."""
    promised = {}
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible not in ("-1", "NoDevFiles"):  # "" / -1 hide every GPU on purpose
        promised["CUDA_VISIBLE_DEVICES"] = visible
    if env.get("SLURM_JOB_GPUS", "").strip():
        promised["SLURM_JOB_GPUS"] = env["SLURM_JOB_GPUS"]
    if env.get("SLURM_GPUS_ON_NODE", "0").strip() not in ("", "0"):
        promised["SLURM_GPUS_ON_NODE"] = env["SLURM_GPUS_ON_NODE"]
    return promised


def check_cuda_expected(env: Optional[Mapping[str, str]] = None) -> None:
    """Raise UserError if GPUs are promised but CUDA is unusable (unless CPLM_ALLOW_CPU=1)."""
    env = os.environ if env is None else env
    promised = gpus_expected(env)
    if not promised or torch.cuda.is_available() or env.get(ALLOW_CPU_ENV) == "1":
        return
    why = ("this torch is a CPU build" if torch.version.cuda is None
           else f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU/driver")
    raise UserError(
        f"GPUs are expected here ({', '.join(f'{k}={v}' for k, v in promised.items())}) but CUDA is unavailable: "
        f"{why}. Refusing to run on CPU over gloo. Install a CUDA build of torch (`make setup` on the GPU node), "
        f"or set {ALLOW_CPU_ENV}=1 to run on CPU on purpose.")
