"""Linear cross entropy without a logits tensor (cplm_kernels.linear_ce) against an fp64 ground truth.

Tolerances (relative: max abs error / max abs reference): fp32 1e-5 -- logits of order 1-10 from
dot products of length <= 64 and sums over <= 1000 classes carry fp32 rounding (6e-8 relative)
amplified by at most a few hundred; bf16/fp16 2e-2 against the same computation with materialized
logits in that dtype (8/11-bit mantissas: ~4e-3 per rounding, a few roundings on each path).
The fused path runs its Triton kernels in the CPU interpreter (tests/kernels/conftest.py).
"""
import pytest
import torch

import cplm_kernels as ck
from cplm_kernels.linear_ce import (
    CEChunks,
    linear_cross_entropy,
    linear_cross_entropy_reference,
    torch_tile_grad,
    torch_tile_stats,
    triton_tile_grad,
    triton_tile_stats,
)
from tests.dist_utils import run_distributed
from tests.kernels import linear_ce_cases as cases

FP32_TOL = 1e-5
HALF_TOL = 2e-2


def assert_matches(actual, expected, tol):
    for name, a, e in zip(("loss", "d_hidden", "d_weight"), actual, expected):
        err = cases.rel(a, e)
        assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("n, h, v, chunks", [
    (50, 16, 97, CEChunks(7, 13)),  # neither dimension a multiple of its chunk
    (50, 16, 97, CEChunks(7, 13, vocab_major=True)),  # the tile stored transposed (the CPU default)
    (50, 16, 97, CEChunks(64, 1000)),  # one tile holds everything
    (9, 8, 11, CEChunks(1, 1)),  # one logit per tile
    (33, 64, 300, CEChunks(32, 128)),
])
def test_chunked_fp32_matches_fp64_ground_truth(n, h, v, chunks):
    case = cases.make_case(n, h, v, seed=n + v)
    got = cases.values_and_grads(linear_cross_entropy, case, torch.float32, chunks=chunks)
    assert_matches(got, cases.ground_truth(case), FP32_TOL)


def test_targets_outside_the_vocabulary_follow_megatron():
    case = cases.make_case(40, 16, 50, seed=5, out_of_range=True)
    got = cases.values_and_grads(linear_cross_entropy, case, torch.float32, chunks=CEChunks(8, 16))
    truth = cases.ground_truth(case)
    assert_matches(got, truth, FP32_TOL)
    logits = case.hidden @ case.weight.t()
    outside = (case.targets < 0) | (case.targets >= 50)
    expected = torch.logsumexp(logits, 1) - logits.amax(1)  # log(sum exp(l - max)): no target logit
    torch.testing.assert_close(got[0][outside], expected[outside], rtol=FP32_TOL, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_matches_materialized_logits(dtype):
    case = cases.make_case(48, 32, 200, seed=7)
    got = cases.values_and_grads(linear_cross_entropy, case, dtype, chunks=CEChunks(16, 64, vocab_major=True))
    ref = cases.values_and_grads(linear_cross_entropy_reference, case, dtype)
    assert_matches(got, ref, HALF_TOL)


def test_gradcheck_fp64():
    # in-vocabulary targets: for the others Megatron's backward (and ours) treats the max as a constant
    case = cases.make_case(6, 4, 9, seed=2)
    fn = lambda hid, w: linear_cross_entropy(hid, w, case.targets, chunks=CEChunks(4, 5))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (case.hidden.clone().requires_grad_(), case.weight.clone().requires_grad_()))


def test_gradient_of_one_input_only():
    case = cases.make_case(20, 8, 30, seed=4)
    _, d_hidden, d_weight = cases.ground_truth(case)
    hidden, weight = case.hidden.float().requires_grad_(), case.weight.float()
    loss = linear_cross_entropy(hidden, weight, case.targets, chunks=CEChunks(8, 8))
    (g,) = torch.autograd.grad(loss, hidden, case.grad.float())
    assert cases.rel(g.double(), d_hidden) <= FP32_TOL
    hidden, weight = case.hidden.float(), case.weight.float().requires_grad_()
    loss = linear_cross_entropy(hidden, weight, case.targets, chunks=CEChunks(8, 8))
    (g,) = torch.autograd.grad(loss, weight, case.grad.float())
    assert cases.rel(g.double(), d_weight) <= FP32_TOL


def test_memory_is_one_tile_not_the_logits():
    """MemTracker follows every storage: the forward leaves O(N) statistics for the backward, and the
    peak beyond inputs and the two returned gradients is a tile plus O(N), far below [N, V] logits."""
    from torch.distributed._tools.mem_tracker import MemTracker

    n, h, v, chunks = 512, 32, 2048, CEChunks(64, 256)
    case = cases.make_case(n, h, v, seed=1)
    hidden, weight = case.hidden.float().requires_grad_(), case.weight.float().requires_grad_()
    grad = case.grad.float()
    cpu = torch.device("cpu")
    tracker = MemTracker()
    tracker.track_external(hidden, weight, case.targets, grad)
    before = tracker.get_tracker_snapshot("current")[cpu]["Total"]
    with tracker:
        loss = linear_cross_entropy(hidden, weight, case.targets, chunks=chunks)
        saved = tracker.get_tracker_snapshot("current")[cpu]["Total"] - before
        loss.backward(grad)
    peak = tracker.get_tracker_snapshot("peak")[cpu]["Total"] - before
    assert saved <= 16 * n  # loss (fp32), log-sum-exp (fp32), targets (int64)
    tile = chunks.elements * 4
    outputs = (n * h + v * h) * 4
    assert peak - outputs <= tile + chunks.tokens * h * 4 + 64 * n  # tile, scaled rows, O(N) vectors
    assert n * v * 4 > 20 * (peak - outputs)  # Megatron's path holds the [N, V] fp32 logits


@pytest.mark.parametrize("bad, message", [
    (dict(hidden=torch.zeros(4, 8), weight=torch.zeros(10, 6)), "hidden must be"),
    (dict(weight=torch.zeros(10, 8, dtype=torch.float64)), "dtypes must match"),
    (dict(targets=torch.zeros(4)), "integer token ids"),
    (dict(targets=torch.zeros(5, dtype=torch.long)), "one per"),
    (dict(impl="triton"), "impl="),
])
def test_bad_inputs_are_named(bad, message):
    kw = dict(hidden=torch.zeros(4, 8), weight=torch.zeros(10, 8), targets=torch.zeros(4, dtype=torch.long))
    kw.update(bad)
    with pytest.raises(ValueError, match=message):
        linear_cross_entropy(kw.pop("hidden"), kw.pop("weight"), kw.pop("targets"), **kw)


# ---- the fused path: Triton kernels in the interpreter ----

needs_triton = pytest.mark.skipif(not ck.fused_available(), reason="triton is not installed")


@needs_triton
def test_tile_kernels_equal_torch_tile_ops():
    g = torch.Generator().manual_seed(0)
    tile = torch.randn(12, 70, generator=g) * 4
    target_col = torch.tensor([0, 69, 5, -1, 70, 200, 33, -100, 1, 68, 2, 3])
    start = (torch.randn(12, generator=g), torch.rand(12, generator=g) * 5, torch.randn(12, generator=g))
    start[0][0] = float("-inf")  # a row's first tile
    start[1][0] = 0.0
    results = []
    for op in (torch_tile_stats, triton_tile_stats):
        m, s, tgt = (x.clone() for x in start)
        op(tile.clone(), target_col, m, s, tgt)
        results.append((m, s, tgt))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)  # fp32, sums of 70 terms
    lse = torch.logsumexp(tile, 1) + torch.randn(12, generator=g).abs()
    grads = []
    for op in (torch_tile_grad, triton_tile_grad):
        t = tile.clone()
        op(t, target_col, lse)
        grads.append(t)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-7)


@needs_triton
@pytest.mark.parametrize("vocab_major", [False, True])
def test_fused_fp32_matches_fp64_ground_truth(vocab_major):
    case = cases.make_case(40, 16, 100, seed=9, out_of_range=True)
    got = cases.values_and_grads(linear_cross_entropy, case, torch.float32, impl="fused",
                                 chunks=CEChunks(16, 32, vocab_major))
    assert_matches(got, cases.ground_truth(case), FP32_TOL)


@needs_triton
def test_fused_bf16_matches_materialized_logits():
    case = cases.make_case(24, 32, 96, seed=11)
    got = cases.values_and_grads(linear_cross_entropy, case, torch.bfloat16, impl="fused", chunks=CEChunks(16, 64))
    ref = cases.values_and_grads(linear_cross_entropy_reference, case, torch.bfloat16)
    assert_matches(got, ref, HALF_TOL)


def test_fused_refuses_fp64():
    with pytest.raises(ValueError, match="fp64"):
        linear_cross_entropy(torch.zeros(2, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64),
                             torch.zeros(2, dtype=torch.long), impl="fused")


# ---- vocabulary parallelism over 2 real processes (gloo) ----

@pytest.mark.slow
@pytest.mark.parametrize("impl, sequence_parallel", [("chunked", False), ("chunked", True), ("fused", True)])
def test_vocab_parallel_two_ranks_equal_one(impl, sequence_parallel):
    if impl == "fused" and not ck.fused_available():
        pytest.skip("triton is not installed")
    n, h, v = 48, 16, 120
    results = run_distributed(cases.vocab_parallel, 2, impl, sequence_parallel, n, h, v)
    loss, d_hidden, d_weight = cases.ground_truth(cases.make_case(n, h, v, seed=3, out_of_range=True))
    for rank, r in enumerate(results):
        assert cases.rel(r["loss"].double(), loss) <= FP32_TOL
        rows = slice(rank * n // 2, (rank + 1) * n // 2) if sequence_parallel else slice(None)
        assert cases.rel(r["d_hidden"].double(), d_hidden[rows]) <= FP32_TOL
        assert cases.rel(r["d_weight"].double(), d_weight[rank * v // 2:(rank + 1) * v // 2]) <= FP32_TOL
