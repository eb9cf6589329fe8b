"""tiny-qwen3 (qk-norm, GQA, head_dim != hidden/heads, untied) with the copy head: one training step at TP=2,
TP=2+SP and PP=2 (1F1B, 4 micro-batches) gives TP=1's loss, gradient norm and copy-head gradients, and at TP=2 the
q/k norms' gradients of TP=1 (each TP rank holds half the heads: megatron-core must sum their shares).
Weights travel through the TP=1 run's torch_dist checkpoint (resharded at load)."""
import pytest

from tests.harness import Call, run_cases
from tests.model.qwen3_workers import step_with_qk_norm_grads

pytestmark = [pytest.mark.mcore, pytest.mark.slow]
# fp32; a layout changes only the order of the sums (the longest over the 4096-entry vocabulary): random-walk
# rounding ~sqrt(4096) * 2^-24 ~ 4e-6 relative -> 1e-5 (tests/parallel/test_layouts.py)
REL = 1e-5
COPY = {"heads": 2, "head_dim": 16, "impl": "chunked"}
LAYOUTS = {"tp2": dict(tp=2), "tp2-sp": dict(tp=2, sp=True), "pp2": dict(pp=2)}


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    init = str(tmp_path_factory.mktemp("qwen3_layouts") / "init")
    [ref] = run_cases([Call("tp1", step_with_qk_norm_grads, ({}, init, COPY, True))], 1)["tp1"]
    cases = run_cases([Call(name, step_with_qk_norm_grads, (layout, init, COPY, False))
                       for name, layout in LAYOUTS.items()], 2)
    return {"ref": ref, "cases": cases}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layout_step_equals_tp1(runs: dict, name: str) -> None:
    ref = runs["ref"]
    assert ref["metrics"]["match_frac"] > 0 and len(ref["qk_norm_grads"]) == 2 * 4  # q and k norms of 4 layers
    for r in runs["cases"][name]:
        assert rel(r["metrics"]["loss"], ref["metrics"]["loss"]) <= REL
        assert rel(r["grad_norm"], ref["grad_norm"]) <= REL
    head = {k: v for r in runs["cases"][name] for k, v in r["head_grads"].items()}
    assert set(head) == set(ref["head_grads"])
    for key, grad in ref["head_grads"].items():
        assert (head[key] - grad).norm() <= REL * grad.norm() + 1e-12, key
    if name.startswith("tp2"):
        for r in runs["cases"][name]:
            assert set(r["qk_norm_grads"]) == set(ref["qk_norm_grads"])
            for key, grad in ref["qk_norm_grads"].items():
                assert grad.norm() > 0, key
                assert (r["qk_norm_grads"][key] - grad).norm() <= REL * grad.norm(), key
