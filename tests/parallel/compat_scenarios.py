"""Scenarios for the megatron-core patch tests. Each runs in fresh (warm, forked) processes, since the patches are
process-wide: `run_scenario(NAME, skip)` with CPLM_COMPAT_SKIP=skip to leave a patch out; the scenario
behaved correctly when its outcome's exit code is 0."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

import torch

from cplm_megatron.parallel.distributed import ParallelConfig
from tests.harness import Outcome, run_captured
from tests.parallel.layouts import build, fixed_batches


def _step(rank: int, kw: dict) -> float:
    from cplm_megatron.training.step import train_step

    _, model_cfg, chunks, opt, sched = build(ParallelConfig(**kw))
    batches = fixed_batches(2, 1, 32, model_cfg.vocab_size, docs=False)  # no explicit mask: default causal mask
    return train_step(chunks, opt, sched, batches, 32, 1).metrics["loss"]


def train_step_single(rank: int) -> None:
    """Model build, forward/backward through Megatron's schedule, optimizer step."""
    assert torch.isfinite(torch.tensor(_step(rank, {})))


def _distopt_resume(rank: int, root: str) -> dict:
    """Distributed optimizer: 2 steps straight vs 1 step, save, fresh load, 1 step."""
    from cplm_megatron.checkpoint.checkpointer import Checkpointer, TrainState
    from cplm_megatron.checkpoint.weights import save_weights
    from cplm_megatron.training.step import train_step

    _, m, chunks, opt, sched = build(ParallelConfig(), distributed_optimizer=True)
    batches = fixed_batches(2, 1, 32, m.vocab_size)
    ckpt = Checkpointer(os.path.join(root, "ckpt"))
    save_weights(chunks, os.path.join(root, "init"))
    train_step(chunks, opt, sched, batches[:1], 32, 1)
    ckpt.save(chunks, opt, sched, TrainState(iteration=1), None, {})
    train_step(chunks, opt, sched, batches[1:], 32, 1)
    straight = [p.detach().clone() for p in chunks[0].parameters()]
    return {"straight": straight}


def _distopt_load(rank: int, root: str) -> dict:
    from cplm_megatron.checkpoint.checkpointer import Checkpointer
    from cplm_megatron.checkpoint.lookup import read_latest
    from cplm_megatron.training.step import train_step

    _, m, chunks, opt, sched = build(ParallelConfig(), distributed_optimizer=True)
    batches = fixed_batches(2, 1, 32, m.vocab_size)
    ckpt = Checkpointer(os.path.join(root, "ckpt"))
    ckpt.load(read_latest(ckpt.root), chunks, opt, sched)
    steps = [st["step"] for st in opt.chained_optimizers[0].optimizer.state.values()]
    aliased = len({id(s) for s in steps}) < len(steps)
    train_step(chunks, opt, sched, batches[1:], 32, 1)
    return {"resumed": [p.detach().clone() for p in chunks[0].parameters()], "aliased": aliased,
            "steps": [float(s) for s in steps]}


def _distopt_scenario(rank: int) -> None:
    """Resume a distributed-optimizer run: loads (no KeyError) and continues exactly (both in this process,
    the load on a freshly built model, optimizer and parallel state)."""
    from tests.harness import _reset_megatron

    with tempfile.TemporaryDirectory() as root:
        a = _distopt_resume(rank, root)
        _reset_megatron()
        b = _distopt_load(rank, root)
    assert not b["aliased"], "all params share one Adam `step` tensor after loading"
    assert all(s == 2.0 for s in b["steps"]), b["steps"][:4]
    for x, y in zip(a["straight"], b["resumed"]):
        # bitwise: the resumed step runs the same ops on the same restored state as the uninterrupted one
        assert torch.equal(x, y), "the resumed step differs from the uninterrupted one"


def _sp_build(rank: int) -> float:
    """TP=2 with sequence parallelism on torch norms."""
    return _step(rank, {"tp": 2, "sp": True})


def _pp_step(rank: int) -> float:
    """PP=2 1F1B step (batched p2p ops)."""
    return _step(rank, {"pp": 2})


def _norm(rank: int) -> dict:
    from megatron.core.optimizer.clip_grads import get_grad_norm_fp32

    from cplm_megatron.parallel.megatron_patches import apply_compat

    apply_compat()
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(4096, 128, generator=g), torch.randn(300, generator=g) * 1e3]
    grads[0][:10] *= 1000
    exact = torch.sqrt(sum(t.double().pow(2).sum() for t in grads)).item()
    return {"megatron": get_grad_norm_fp32(grads), "exact": exact}


def _grad_norm_scenario(rank: int) -> None:
    """Megatron's grad norm (used for clipping) is exact to fp32 precision."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_* from the harness
    ps.initialize_model_parallel()
    r = _norm(rank)
    # fp64 accumulation (the patch) leaves only the final fp32 rounding (2^-24 ~ 6e-8 relative); torch's fp32
    # norm was off by ~2e-4 here: 1e-6 separates the two
    assert abs(r["megatron"] - r["exact"]) <= 1e-6 * r["exact"], r


def _compile_scenario(rank: int) -> None:
    """A transformer layer of the local spec traces whole under torch.compile (dynamo's explain: no inductor)."""
    import torch._dynamo as dynamo

    _, _, chunks, _, _ = build(ParallelConfig())
    model = chunks[0].module
    layer = model.decoder.layers[0]
    hidden = torch.randn(16, 2, model.config.hidden_size, requires_grad=True)
    explained = dynamo.explain(layer)(hidden, attention_mask=None, rotary_pos_emb=model.rotary_pos_emb(16))
    reasons = "; ".join(str(r.reason).splitlines()[0] for r in explained.break_reasons)
    assert explained.graph_break_count == 0, f"{explained.graph_break_count} graph break(s): {reasons}"


class _PythonCalls(torch.overrides.TorchFunctionMode):
    """Counts the torch calls made from Python, by name (a foreach op is one call, a per-tensor loop one per
    tensor; attribute reads are calls too: the scenario looks at the copies and multiplies)."""

    def __init__(self):
        super().__init__()
        self.calls: dict = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _foreach_scenario(rank: int) -> None:
    """Clipping the gradients and copying fp32 main params to bf16 model params take a constant number of torch
    calls, not one or two per parameter (each a kernel launch on a GPU); the values are megatron-core's."""
    from megatron.core.optimizer import optimizer as mo
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    n = 24
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 4, generator=g)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(8, 4, generator=g)
    want = [p.grad * (1.0 / (10.0 + 1.0e-6)) for p in params]
    model = [torch.empty(8, 4, dtype=torch.bfloat16) for _ in range(n)]
    with _PythonCalls() as counter:
        clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=10.0)
        mo._multi_tensor_copy_this_to_that(this=[p.detach() for p in params], that=model, overflow_buf=None)
    per_tensor = {k: v for k, v in counter.calls.items() if v >= n and ("copy" in k or "mul" in k)}
    assert not per_tensor, f"per-tensor torch calls for {n} parameters: {per_tensor}"
    assert all(torch.equal(p.grad, w) for p, w in zip(params, want))
    assert all(torch.equal(m, p.detach().to(torch.bfloat16)) for m, p in zip(model, params))


def _results_queue_scenario(rank: int) -> None:
    """A checkpoint save's write results reach the trainer through megatron's Manager, whose server process (spawned
    by the first save) never imports torch; the checkpoint loads back equal."""
    import psutil
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    from cplm_megatron.parallel.distributed import init_process_groups

    init_process_groups(ParallelConfig())
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with tempfile.TemporaryDirectory() as root:
        dist_checkpointing.save({"w": ShardedTensor.from_rank_offsets("w", weight)}, root)
        servers = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
        assert servers, "no Manager server was spawned by the save"
        with_torch = [p.pid for p in servers if "libtorch" in open(f"/proc/{p.pid}/maps").read()]
        for server in servers:  # this worker ends with os._exit: no Manager finalizer runs
            server.terminate()
        assert not with_torch, f"the save's results Manager (pid {with_torch}) imported torch"
        loaded = dist_checkpointing.load({"w": ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4))}, root)
    assert torch.equal(loaded["w"], weight)


# name -> (world size, the function every rank runs)
SCENARIOS: dict[str, tuple[int, Callable]] = {
    "train_step_single": (1, train_step_single),
    "distopt_resume": (1, _distopt_scenario),
    "sequence_parallel": (2, _sp_build),
    "pipeline_parallel": (2, _pp_step),
    "grad_norm_precision": (1, _grad_norm_scenario),
    "compile_layer": (1, _compile_scenario),
    "foreach_fallback": (1, _foreach_scenario),
    "results_queue": (1, _results_queue_scenario),
}


def run_scenario(name: str, skip: str = "", verbose: bool = False) -> Outcome:
    """The scenario in fresh processes with the compat layer (less `skip`, comma-separated patch names); `verbose`:
    with CPLM_VERBOSE=1 (rank 0 logs the applied patches)."""
    world, fn = SCENARIOS[name]
    return run_captured(fn, world, env={"CPLM_COMPAT_SKIP": skip, **({"CPLM_VERBOSE": "1"} if verbose else {})})
