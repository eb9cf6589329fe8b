"""Shared input builders and comparison helpers for the kernel tests."""
from __future__ import annotations

from collections.abc import Callable

import torch


def make_inputs(
    b: int,
    H: int,
    T: int,
    d: int,
    *,
    dtype: torch.dtype = torch.float32,
    n_labels: int = 5,
    ignored_frac: float = 0.15,
    doc_len: int | None = 23,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random q, k (leaf tensors requiring grad), labels with some ignored (-100), documents of ~doc_len."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, H, T, d, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(b, H, T, d, generator=gen).to(dtype).requires_grad_()
    labels = torch.randint(0, n_labels, (b, T), generator=gen)
    labels[torch.rand(b, T, generator=gen) < ignored_frac] = -100
    doc_ids = None
    if doc_len is not None:
        # boundaries at random offsets: they fall in the middle of tiles
        starts = torch.rand(b, T, generator=gen) < 1.0 / doc_len
        doc_ids = torch.cumsum(starts, dim=1)
    return q, k, labels, doc_ids


def random_output_grads(shape, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def outputs_and_grads(
    fn: Callable, q: torch.Tensor, k: torch.Tensor, g_all: torch.Tensor, g_match: torch.Tensor, **kw
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lse_all, lse_match, dq, dk) of ``fn`` under the loss sum(g_all * lse_all + g_match * lse_match)
    over finite outputs (empty sets have constant -inf outputs)."""
    lse_all, lse_match = fn(q, k, **kw)
    loss = (torch.where(torch.isfinite(lse_all), lse_all, 0.0) * g_all).sum() + (
        torch.where(torch.isfinite(lse_match), lse_match, 0.0) * g_match
    ).sum()
    dq, dk = torch.autograd.grad(loss, (q, k))
    return lse_all.detach(), lse_match.detach(), dq, dk


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| over finite entries; -inf pattern must agree exactly."""
    finite = torch.isfinite(expected)
    # a boolean pattern: -inf marks empty candidate sets, exactly
    assert torch.equal(torch.isfinite(actual), finite), "finite/-inf pattern differs from the reference"
    assert not torch.isnan(actual).any(), "NaN in output"
    if not finite.any():
        return 0.0
    a, e = actual[finite].double(), expected[finite].double()
    return ((a - e).abs().max() / e.abs().max().clamp_min(1e-30)).item()


def assert_close_all(actual: tuple, expected: tuple, tol: float, names=("lse_all", "lse_match", "dq", "dk")):
    for name, a, e in zip(names, actual, expected):
        err = rel_err(a, e)
        assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"
