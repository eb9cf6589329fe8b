"""Inputs, the fp64 ground truth and 2-process workers for the linear cross-entropy tests."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cplm_kernels.linear_ce import CEChunks, linear_cross_entropy, linear_cross_entropy_reference


@dataclass
class CECase:
    hidden: torch.Tensor  # [N, h] fp64
    weight: torch.Tensor  # [V, h] fp64
    targets: torch.Tensor  # [N]
    grad: torch.Tensor  # [N] upstream gradient of the per-token loss (fp64)


def make_case(n: int, h: int, v: int, seed: int = 0, out_of_range: bool = False) -> CECase:
    """Logits of order 1-10 (weights ~ 1/sqrt(h) * 3), random per-token upstream gradients (some 0)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) * (3.0 / h**0.5)
    targets = torch.randint(0, v, (n,), generator=g)
    if out_of_range:  # Megatron's rule for ids outside the vocabulary (e.g. -100): CE = log(sum exp(l - max))
        targets[::7] = -100
        targets[3::11] = v + 5
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    grad[::5] = 0.0  # loss-masked tokens
    return CECase(hidden, weight, targets, grad)


def values_and_grads(fn, case: CECase, dtype: torch.dtype, **kw):
    """(loss, d hidden, d weight) of ``fn`` on the case cast to ``dtype``, returned in fp64."""
    hidden = case.hidden.to(dtype).requires_grad_()
    weight = case.weight.to(dtype).requires_grad_()
    loss = fn(hidden, weight, case.targets, **kw)
    d_hidden, d_weight = torch.autograd.grad(loss, (hidden, weight), case.grad.to(loss.dtype))
    assert d_hidden.dtype == dtype and d_weight.dtype == dtype
    return loss.detach().double(), d_hidden.double(), d_weight.double()


def ground_truth(case: CECase):
    """fp64 logits and cross entropy (independent of the tiled code path)."""
    return values_and_grads(linear_cross_entropy_reference, case, torch.float64)


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def vocab_parallel(rank: int, impl: str, sequence_parallel: bool, n: int, h: int, v: int) -> dict:
    """This rank's (loss, d hidden, d weight) with half the vocabulary (and half the rows under SP)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    case = make_case(n, h, v, seed=3, out_of_range=True)
    rows = n // world
    hidden = case.hidden.float()
    if sequence_parallel:
        hidden = hidden[rank * rows:(rank + 1) * rows]
    part = v // world
    hidden = hidden.clone().requires_grad_()
    weight = case.weight.float()[rank * part:(rank + 1) * part].clone().requires_grad_()
    loss = linear_cross_entropy(hidden, weight, case.targets, impl=impl, vocab_start=rank * part,
                                group=dist.group.WORLD, sequence_parallel=sequence_parallel,
                                chunks=CEChunks(tokens=24, vocab=40))
    d_hidden, d_weight = torch.autograd.grad(loss, (hidden, weight), case.grad.float())
    return {"loss": loss.detach(), "d_hidden": d_hidden, "d_weight": d_weight}
