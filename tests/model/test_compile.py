"""`model.compile`: the tiny recipe trains compiled (inductor on CPU) to the eager run's losses, pipeline stages
compile their own layers, tensor and context parallelism and activation recomputation are refused with one line;
`model.fused_swiglu` gives megatron-core's SwiGLU values."""
import json

import pytest
import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.run_config import load_run_config
from tests.harness import REPO
from tests.training import pretrain_utils as pu

TINY = REPO / "configs" / "tiny.yaml"
COMPILED_ITERS = 3
# One inductor cache for this module's processes: the layer graphs compiled once are reused (same shapes).
_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


@pytest.fixture(scope="module")
def inductor_env(tmp_path_factory) -> dict:
    return {_CACHE_ENV: str(tmp_path_factory.mktemp("inductor")), "TORCHINDUCTOR_COMPILE_THREADS": "1"}


@pytest.mark.parametrize("setting, message", [
    ("parallel.tp=2", r"model.compile=true supports parallel.tp=1 and parallel.cp=1 \(got parallel.tp=2\)"),
    ("parallel.cp=2", r"model.compile=true supports parallel.tp=1 and parallel.cp=1 \(got parallel.cp=2\)"),
    ("recompute.granularity=selective", r"does not combine with recompute.granularity=selective: set "
                                        r"recompute.granularity=none or model.compile=false"),
], ids=["tp2", "cp2", "selective_recompute"])
def test_compile_is_refused_under_tp_cp_and_recomputation(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(TINY, ["model.compile=true", setting])
    load_run_config(TINY, ["model.compile=false", setting])
    load_run_config(TINY, ["model.compile=true", "parallel.pp=2"])  # pipeline stages compile their own layers


def test_the_entry_point_refuses_it_with_one_line_and_exit_2(tmp_path, capsys):
    from cplm_megatron.pretrain import main

    code = main(["--config", str(TINY), "--set", f"run.dir={tmp_path / 'run'}", "model.compile=true",
                 "parallel.tp=2"])
    err = capsys.readouterr().err
    assert code == 2, err
    [line] = [x for x in err.splitlines() if x.startswith("error:")]
    assert "model.compile=true supports parallel.tp=1" in line and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.mcore
@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_compiled_tiny_recipe_trains_to_the_eager_losses(stdlib_corpus, tmp_path, reference_run, inductor_env):
    """The tiny recipe (copy head, document masking, fp32) with model.compile=true: its first iterations' losses
    are the session's eager reference run's, and the profiled steps ran compiled layers."""
    run_dir = tmp_path / "run"
    overrides = pu.tiny_overrides(stdlib_corpus, run_dir, 10, **{
        "train.eval_interval": 5, "model.compile": "true", "train.exit_after_iters": COMPILED_ITERS,
        "train.profile_steps": f"[2,{COMPILED_ITERS}]"})
    proc = pu.run(1, overrides, extra_env=inductor_env)
    assert proc.returncode == 75, proc.stdout[-3000:] + proc.stderr[-3000:]
    got, want = pu.losses(run_dir), reference_run["losses"]
    eps = torch.finfo(torch.float32).eps
    for it in range(1, COMPILED_ITERS + 1):
        # inductor's fused kernels round as eager's ops do, but reorder the norms' sums and vectorize exp/sigmoid:
        # a few ulps per fused op, ~16 fused ops per layer, 4 layers, and each step's update carries the last
        # step's differences (Adam normalizes them per weight): (16 x 4 x it) ulps of the loss, relative
        tol = 16 * 4 * it * eps
        assert got[it] == pytest.approx(want[it], rel=tol), (it, got[it], want[it])
    profile = json.loads((run_dir / "profile.json").read_text())
    assert profile["iterations"] == [2, COMPILED_ITERS] and len(profile["step_s"]) == COMPILED_ITERS - 1
    # 4 layers x 2 micro-batches, each layer a few compiled regions around its eager document attention
    assert profile["compiled_regions_per_step"] >= 8, profile
    assert profile["cpu_ops_per_step"] > 0 and profile["top_cpu_ops"], profile


@pytest.mark.mcore
@pytest.mark.slow
@pytest.mark.usefixtures("isolated_streaming")
def test_pipeline_stages_compile_their_layers(stdlib_corpus, tmp_path, inductor_env):
    """PP=2 with model.compile=true trains to the eager PP=2 losses (pipeline stages are seeded per stage, so
    the eager PP=2 run is the reference; the layer graphs come from the cache the recipe test filled)."""
    losses = {}
    for compiled in ("false", "true"):
        run_dir = tmp_path / f"compile_{compiled}"
        proc = pu.run(2, pu.tiny_overrides(stdlib_corpus, run_dir, 2, **{
            "parallel.pp": 2, "model.compile": compiled, "checkpoint.enabled": "false"}), extra_env=inductor_env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        losses[compiled] = pu.losses(run_dir)
    eps = torch.finfo(torch.float32).eps
    for it in (1, 2):
        assert losses["true"][it] == pytest.approx(losses["false"][it], rel=16 * 4 * it * eps), (it, losses)


def swiglu_paths(rank: int) -> dict:
    """One MLP of the tiny model (same weights) with and without model.fused_swiglu, compiled functions run eager
    (torch.compiler stance): its output, the gradient at the SwiGLU's input, and the bytes autograd saved."""
    from cplm_megatron.parallel.distributed import ParallelConfig
    from tests.harness import _reset_megatron
    from tests.parallel.layouts import build

    out = {}
    for fused in (False, True):
        _, _, chunks, _, _ = build(ParallelConfig(), fused_swiglu=fused)
        mlp = chunks[0].module.decoder.layers[0].mlp
        grads = []

        def keep_grad(module, inputs, output, grads=grads):
            output[0].register_hook(grads.append)

        mlp.linear_fc1.register_forward_hook(keep_grad)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(16, 2, mlp.config.hidden_size, generator=g, requires_grad=True)
        saved = []
        with torch.compiler.set_stance("force_eager"), \
                torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(t.numel() * t.element_size()) or t,
                                                         lambda t: t):
            y, _ = mlp(x)
        y.backward(torch.randn(y.shape, generator=g))
        out[fused] = {"y": y.detach(), "grad_in": grads[0], "saved": sum(saved),
                      "tokens_x_ffn": 16 * 2 * mlp.config.ffn_hidden_size}
        _reset_megatron()
    return out


@pytest.mark.mcore
@pytest.mark.slow
def test_fused_swiglu_is_megatron_cores_swiglu():
    """model.fused_swiglu=true runs megatron-core's SwiGLU function: the same output, the input gradient within the
    rounding of its different formula, and one activation fewer kept for the backward (SiLU's output)."""
    from tests.harness import run_distributed

    [r] = run_distributed(swiglu_paths, 1)
    plain, fused = r[False], r[True]
    assert torch.equal(plain["y"], fused["y"])  # silu(a) * b, the same two ops
    # swiglu_back: g * sigmoid(a) * (1 + a * (1 - sigmoid(a))) * b, autograd the same factors in another order:
    # <= 6 roundings each, relative to each element's own magnitude
    eps = torch.finfo(torch.float32).eps
    diff = (plain["grad_in"] - fused["grad_in"]).abs()
    assert bool((diff <= 12 * eps * plain["grad_in"].abs() + 1e-30).all()), float(diff.max())
    assert plain["saved"] - fused["saved"] == plain["tokens_x_ffn"] * 4  # one fp32 [tokens, ffn] tensor less
