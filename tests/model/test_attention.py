"""SDPA core attention (cplm_megatron/model/attention.py) against megatron-core's unfused DotProductAttention:
the same weights give the same forward and gradients with and without document masking, at TP=1 and TP=2 (SP,
GQA 4/2), under recompute and in bf16; the tiny recipe trains to the same losses with either; resolution and
refusals of `model.attention_impl`."""
import pytest
import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import load_preset
from tests.dist_utils import run_distributed
from tests.model import attention_workers as w

# SDPA = megatron's attention on both megatron-core legs (the newest is the GPU users' release)
pytestmark = [pytest.mark.mcore, pytest.mark.mcore_latest]


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def results(request):
    """One process group per world size runs every case (tests/model/attention_workers.py::compare)."""
    return request.param, run_distributed(w.compare, request.param, request.param)


def _close_fp32(a: torch.Tensor, b: torch.Tensor) -> None:
    # Both compute in fp32: the scores (d=32 products) and softmax/AV sums (<= 48 keys) are reduced in other
    # orders (baddbmm + softmax vs a fused kernel): a few units of sqrt(48) * 2^-24 ~ 4e-7 relative per reduction;
    # through 4 layers and the backward of a 4096-way cross entropy 1e-5 relative. An entry near zero is a sum
    # that cancels: its error is relative to the terms, not to itself -- at most (48 - 1) * 2^-24 ~ 2.8e-6 of the
    # largest |term| (~ the tensor's largest entry) per reduction, so 1e-5 of the largest entry absolute
    # (the core output's worst entry, ~1e-3 with |v| up to ~4, is 1.9e-6 off)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.slow
def test_core_attention_equals_megatron_forward_and_gradients(results):
    tp, per_rank = results
    for r in per_rank:
        core = r["core"]
        for masking in (False, True, "documents"):
            (s, m) = core[(str(torch.float32), masking)]
            _close_fp32(s["out"], m["out"])
            for gs, gm in zip(s["grads"], m["grads"]):
                _close_fp32(gs, gm)
            (s, m) = core[(str(torch.bfloat16), masking)]
            # bf16: SDPA rounds the scores/probabilities it keeps and its output to bf16 (2^-9 relative, scores up
            # to |s| ~ 12 -> ~0.02 absolute on a logit, ~2% on a probability); outputs/gradients are convex
            # combinations of O(1) values: 5e-2 absolute bounds it with margin (fp32 agreement shows the maths)
            torch.testing.assert_close(s["out"], m["out"], rtol=0, atol=5e-2)
            for gs, gm in zip(s["grads"], m["grads"]):
                torch.testing.assert_close(gs, gm, rtol=0, atol=5e-2 * gm.abs().max().item())
        # document masking changes the result (the mask reaches both paths, in both forms)
        causal = core[(str(torch.float32), False)][0]["out"]
        for masking in (True, "documents"):
            assert (core[(str(torch.float32), masking)][0]["out"] - causal).abs().max() > 1e-3
        assert core["dropout"] == {"repeatable": True, "differs_from_eval": True}


@pytest.mark.slow
def test_models_with_sdpa_and_megatron_attention_agree(results):
    tp, per_rank = results
    for r in per_rank:
        model = r["model"]
        for masking in (False, True):
            s, m = model[("sdpa", masking)], model[("megatron", masking)]
            assert s["kinds"] >= {"SDPAttention"} and "DocumentMaskedDotProductAttention" not in s["kinds"]
            assert "DocumentMaskedDotProductAttention" in m["kinds"] and "SDPAttention" not in m["kinds"]
            _close_fp32(s["loss"], m["loss"])
            assert s["grads"].keys() == m["grads"].keys()
            for name in s["grads"]:
                # parameter gradients sum over all 96 tokens: 1e-5 relative of the largest entry
                scale = m["grads"][name].abs().max().item()
                torch.testing.assert_close(s["grads"][name], m["grads"][name], rtol=1e-5, atol=1e-5 * scale)
        assert (model[("sdpa", True)]["loss"] - model[("sdpa", False)]["loss"]).abs().max() > 1e-3
        if tp == 1:
            ref = model[("sdpa", True)]
            for key in ("sdpa_selective", "sdpa_full"):  # recomputation re-runs the same kernel: bitwise equal
                assert torch.equal(model[(key, True)]["loss"], ref["loss"])
                for name, g in ref["grads"].items():
                    torch.testing.assert_close(model[(key, True)]["grads"][name], g, rtol=1e-6, atol=0)
            sb, mb = model[("sdpa_bf16", True)], model[("megatron_bf16", True)]
            # bf16 training: per-token losses (~8.3 = ln 4096) through 4 bf16 layers differ by bf16 rounding of
            # the activations (2^-9 relative per op): 1e-2 relative
            torch.testing.assert_close(sb["loss"], mb["loss"], rtol=1e-2, atol=0)
            torch.testing.assert_close(sb["loss"], ref["loss"], rtol=1e-2, atol=0)


def test_attention_impl_resolution_and_refusals():
    from cplm_megatron.model.builder import attention_impl, te_available, use_te_spec

    assert load_preset("tiny").attention_impl == "auto"
    assert attention_impl(load_preset("tiny"), use_te=False) == "sdpa"  # the default without TE
    assert attention_impl(load_preset("tiny"), use_te=True) == "te"
    assert attention_impl(load_preset("tiny", attention_impl="megatron"), use_te=True) == "megatron"
    if not te_available():
        with pytest.raises(ConfigError, match="attention_impl=te needs transformer_engine.*attention_impl=sdpa"):
            use_te_spec(load_preset("tiny", attention_impl="te"))
    with pytest.raises(ConfigError, match="attention_impl=te needs the Transformer Engine layer spec"):
        load_preset("tiny", attention_impl="te", layer_spec="local").validate()
    with pytest.raises(ConfigError, match="attention_impl"):
        load_preset("tiny", attention_impl="flash")


@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
@pytest.mark.parametrize("masking", [True, False], ids=["document_masking", "causal"])
def test_tiny_recipe_trains_to_the_same_losses(stdlib_corpus, tmp_path, masking):
    """pretrain_cplm.py on configs/tiny.yaml, 4 iterations: the default (auto = sdpa without TE; with document
    masking) or explicit sdpa (causal) against megatron's unfused attention."""
    from tests.training import pretrain_utils as pu

    iters = 4
    runs = {}
    for impl in ("auto" if masking else "sdpa", "megatron"):
        run_dir = tmp_path / impl
        extra = {"data.document_masking": str(masking).lower(), "checkpoint.interval": 1000}
        if impl != "auto":
            extra["model.attention_impl"] = impl
        proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, run_dir, iters, **extra))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[impl] = pu.losses(run_dir)
    sdpa, megatron = runs.pop("megatron"), runs.popitem()[1]
    assert sorted(sdpa) == list(range(1, iters + 1))
    for it in range(1, iters + 1):
        # same maths, other fp32 reduction orders in the attention: per step ~1e-6 relative, compounding over
        # 4 Adam steps at lr 2e-3 into the losses: 1e-4 relative (tests/training/pretrain_utils.py)
        assert sdpa[it] == pytest.approx(megatron[it], rel=1e-4), (it, sdpa, megatron)
    if masking:  # the attention holds no state: megatron's checkpoint resumes with SDPA (a reported change)
        proc = pu.run(1, pu.tiny_overrides(stdlib_corpus, tmp_path / "megatron", iters + 1,
                                           **{"model.attention_impl": "sdpa", "checkpoint.interval": 1000}))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "model.attention_impl: 'megatron' -> 'sdpa'" in proc.stdout + proc.stderr
        assert sorted(pu.losses(tmp_path / "megatron")) == list(range(1, iters + 2))


@pytest.mark.slow
@pytest.mark.parametrize("results", [1], ids=["tp1"], indirect=True)  # measured in the TP=1 process group
def test_memory_estimate_follows_the_attention_in_use(results):
    """What one layer's core attention keeps for its backward (measured through autograd's saved tensors, bf16)
    is what accounting.attention_bytes counts, and the planner's totals follow model.attention_impl."""
    from cplm_megatron.model.sizing.accounting import GIB, attention_bytes, memory_estimate

    _, [saved, *_] = results
    saved = saved["saved"]
    cfg = load_preset("tiny")
    b, s, h, d = w.B, w.S, cfg.num_attention_heads, cfg.head_dim

    def est(impl: str, masking: bool) -> float:
        return attention_bytes(cfg, s, b, 1, 1, impl, 2, "none", masking)["held"]

    for masking in (False, True):
        got = {}
        for impl in ("sdpa", "megatron"):
            entries = saved[(impl, masking)]
            # per-head [s, s] storages (scores/probabilities), shared [s, s] ones (masks), the log-sum-exps
            # ([b, heads, s], or [1, heads, length] per document) and SDPA's outputs + repeated k/v (head-shaped)
            square = [(n, shape) for n, shape, _ in entries if shape[-2:] == (s, s)]
            got[impl] = {
                "per_head": sum(n for n, shape in square if torch.Size(shape).numel() >= b * h * s * s),
                "shared": sum(n for n, shape in square if torch.Size(shape).numel() < b * h * s * s),
                "lse": sum(n for n, shape, dtype in entries if len(shape) == 3 and shape[1] == h and dtype == "torch.float32"),
                "heads": sum(n for n, shape, _ in entries if len(shape) == 4 and shape[1] == h and shape[-1] == d),
            }
        sd, mg = got["sdpa"], got["megatron"]
        assert sd["per_head"] == 0 and mg["per_head"] == est("megatron", False) == 6 * b * h * s * s
        assert sd["shared"] == 0  # no [s, s] tensor, also with document masking (one attention per document)
        assert sd["lse"] == est("sdpa", False) == 4 * b * h * s
        assert sd["heads"] == 2 * b * h * s * d  # the output only: on CPU grouped k/v are not repeated
        if masking:  # the estimate adds the copies CUDA's varlen kernel reads: k/v repeated for GQA (4 heads,
            # 2 groups here) and, at micro-batch 2, q packed row after row
            assert est("sdpa", True) == sd["lse"] + 2 * b * h * s * d * 2 + b * h * s * d * 2
            assert mg["shared"] >= b * s * s  # megatron's dense boolean mask, built from the document ids
    # SmolLM2-1.7B, seq 2048, micro 4, bf16 (the figures): the unfused attention holds
    # 24 layers x 4 x 32 heads x 2048^2 x (4 + 2) B = 72 GiB; SDPA none of it (a log-sum-exp per head and token)
    big = load_preset("smollm2-1.7b")
    unfused = attention_bytes(big, 2048, 4, 1, big.num_layers, "megatron")
    assert unfused["held"] == 24 * 4 * 32 * 2048**2 * 6 == 72 * GIB
    assert attention_bytes(big, 2048, 4, 1, big.num_layers, "megatron", recompute="selective")["held"] == 0
    assert attention_bytes(big, 2048, 4, 1, big.num_layers, "sdpa")["held"] < 0.1 * GIB
    mem = {impl: memory_estimate(big, None, seq_len=2048, micro_batch=4, attention=impl)["total_gib"]
           for impl in ("sdpa", "megatron")}
    assert 70 < mem["megatron"] - mem["sdpa"] < 80, mem


@pytest.mark.slow
def test_attention_impl_te_without_transformer_engine_exits_2(tmp_path):
    from cplm_megatron.model.builder import te_available
    from tests.training import pretrain_utils as pu

    if te_available():
        pytest.skip("Transformer Engine is installed here")
    proc = pu.run(1, [f"run.dir={tmp_path / 'run'}", "model.attention_impl=te", "data.synthetic=copy",
                      "logging.wandb=false"])
    pu.assert_bad_input(proc, "model.attention_impl=te needs transformer_engine", "model.attention_impl=sdpa")
    assert not (tmp_path / "run").exists()
