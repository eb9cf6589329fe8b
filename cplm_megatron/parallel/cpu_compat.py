"""The CPU-compat layer: the only place where megatron-core is patched.

megatron-core assumes CUDA (and Apex or Transformer Engine). Each patch below names the megatron-core
code it replaces and why (PLATFORM.md lists the measurements). Two scopes:

* ``cpu``        — applied only when CUDA is absent (``torch.cuda.is_available()`` is False);
                   these never touch a GPU run.
* ``no_apex_te`` — megatron-core bugs on its own no-Apex/TE code path (torch Adam, torch norms);
                   applied whenever neither Apex nor Transformer Engine is importable, GPU or not.

``apply_compat()`` is idempotent (each patch marks what it patched) and returns the patch names in
effect. Tests apply all patches but one in a fresh process to show each one is needed.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Iterable, List

import torch

_MARK = "__cplm_compat__"


@dataclass(frozen=True)
class Patch:
    """One named patch of megatron-core."""

    name: str
    replaces: str
    scope: str  # "cpu" or "no_apex_te"
    apply: Callable[[], None]


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
          "no_apex_te", _patch_distopt_missing_state_keys),
    Patch("shared_step", "optimizer/distrib_optimizer.py DistributedOptimizer.load_state_dict: one "
          "`step` tensor shared by all params (wrong Adam bias correction after resume)",
          "no_apex_te", _patch_distopt_shared_step),
    Patch("sp_norm", "transformer/torch_norm.py WrappedTorchNorm: asserts no sequence parallel",
          "no_apex_te", _patch_torch_norm_sequence_parallel),
    Patch("grad_norm_precision", "optimizer/clip_grads.py l2_norm_impl (utils.local_multi_tensor_l2_norm): "
          "torch.norm on CPU fp32 is off by ~1e-4 relative for large tensors, so the grad norm (and "
          "clipping) depended on the TP layout; accumulate in fp64", "cpu", _patch_grad_norm_precision),
]


def cuda_absent() -> bool:
    """True on machines where the ``cpu`` patches apply."""
    return not torch.cuda.is_available()


def apex_or_te_present() -> bool:
    """megatron-core's own test for its fused (Apex/TE) optimizer and norm path."""
    from megatron.core.optimizer import distrib_optimizer

    return bool(getattr(distrib_optimizer, "HAVE_APEX_OR_TE", False))


def apply_compat(skip: Iterable[str] = ()) -> List[str]:
    """Apply every patch whose scope holds on this machine (minus `skip`); returns their names."""
    skip = set(skip) | set(filter(None, os.environ.get("CPLM_COMPAT_SKIP", "").split(",")))
    unknown = skip - {p.name for p in PATCHES}
    if unknown:
        raise ValueError(f"unknown compat patch(es) {sorted(unknown)}; known: {[p.name for p in PATCHES]}")
    scopes = set()
    if cuda_absent():
        scopes.add("cpu")
    if not apex_or_te_present():
        scopes.add("no_apex_te")
    applied = []
    for patch in PATCHES:
        if patch.scope in scopes and patch.name not in skip:
            patch.apply()
            applied.append(patch.name)
    return applied
