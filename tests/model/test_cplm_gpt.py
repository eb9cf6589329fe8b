"""CPLMGPTModel (Megatron GPTModel + Copy-Paste head): causality, edge positions, full distribution,
the disabled head as the exact baseline, document ids through the training batch path, gradients
across TP ranks, Megatron-native inference, the megatron-core signature it relies on, learning SpamLang."""
import pytest
import torch

from tests.data_fixtures import streaming_segments_removed
from tests.harness import Call, run_cases
from tests.model import copy_workers as w
from tests.parallel.layouts import one_step

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)


@pytest.mark.slow
def test_causality_exact(runs):
    [res] = runs["causality"]
    for t, earlier_equal, later_changed in res["results"]:
        assert earlier_equal, f"loss before position {t + 1} changed when only later tokens changed"
        assert later_changed


@pytest.mark.slow
def test_positions_without_candidates_have_zero_gate_and_lm_loss(runs):
    [r] = runs["no_candidates"]
    none = ~r["has_candidate"]
    assert none[:, 0].all() and none[:, 16].all()  # sequence start and document start
    assert none[1, :9].all()  # masked history: the first candidate of row 1 is position 8
    assert (r["gate"][none] == 0).all()
    assert torch.equal(r["loss"][none], r["lm_ce"][none].float())  # bitwise: no candidate, the loss is the LM CE itself
    assert r["has_candidate"].sum() > 0 and (r["gate"][r["has_candidate"]] > 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_full_distribution_sums_to_one_and_matches_the_loss(tp, runs):
    results = runs[f"distribution_tp{tp}"]
    for r in results:
        # fp32 sum of 4096 probabilities (over TP shards): random-walk rounding sqrt(4096) * 2^-24 ~ 4e-6 -> 1e-5
        torch.testing.assert_close(r["mass"], torch.ones_like(r["mass"]), rtol=0, atol=1e-5)
        valid = r["mask"] > 0
        # the loss path and the distribution path reach log p(y) through different fp32 reductions over the
        # 4096-entry vocabulary: a few units of sqrt(4096) * 2^-24 ~ 4e-6 relative
        torch.testing.assert_close(r["at_target"].exp()[valid], (-r["loss"][valid]).exp(), rtol=1e-5, atol=1e-6)
        # the gathered log-probs are the shards' own values except for the logsumexp's reduction order across
        # shards: |log p| <~ 10 carries ~10 * 2^-24 ~ 6e-7 absolute
        torch.testing.assert_close(r["gathered_at_target"], r["at_target"], rtol=0, atol=1e-6)
        assert r["gathered_shape"][-1] == 4096
        assert r["without_labels_is_the_mixture"] and r["mixture_differs_from_lm"]


@pytest.mark.slow
def test_disabled_head_is_the_plain_backbone_bit_for_bit(runs):
    [r] = runs["disabled"]
    assert r["names_equal"] and r["params_equal"] and r["n_params"] == r["n_plain"]
    assert r["loss_equal"] and r["grads_equal"]


@pytest.mark.slow
def test_tiny_cplm_learns_spamlang(runs):
    [r] = runs["spamlang"]
    assert r["vocab"] >= 64 * r["hidden"]
    assert max(r["acc"]) >= 0.99, r["acc"]
    first = next(i for i, a in enumerate(r["acc"]) if a >= 0.99)
    assert first < 40, r["acc"]


EOD = 0


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> str:
    """A packed dataset of short documents (3-12 tokens from a 12-token alphabet: many copy matches, several
    document boundaries in every 32-token sample), EOD id 0."""
    from tests.data_fixtures import write_synthetic_dataset

    g = torch.Generator().manual_seed(11)
    docs = [torch.randint(1, 13, (int(torch.randint(3, 13, (1,), generator=g)),), generator=g).tolist()
            for _ in range(80)]
    path = tmp_path_factory.mktemp("short-docs") / "train"
    write_synthetic_dataset(path, docs, seq_len=32)
    return str(path)


BATCH_PATH_LAYOUTS = {"tp1": {"tp": 1}, "tp2-sp": {"tp": 2, "sp": "true"}, "pp2": {"pp": 2}}
SENTINEL = {"heads": 2, "head_dim": 16, "impl": "chunked", "mixing": "sentinel", "gate_bias_init": 3.0}


@pytest.fixture(scope="module")
def runs(short_documents, tmp_path_factory) -> dict:
    """Every worker of this module, one process group per world size (megatron's state rebuilt per case)."""
    root = tmp_path_factory.mktemp("cplm-gpt")

    def batch_path(name: str) -> Call:
        layout = BATCH_PATH_LAYOUTS[name]
        overrides = [f"run.dir={root / name}", f"data.streams=[{short_documents}]", "data.val_streams=[]",
                     "data.document_masking=false", "data.eod_mask_loss=false", "train.iters=1", "train.seq_len=32",
                     "train.micro_batch=2", "train.global_batch=4", "train.eval_interval=0", "train.log_interval=1",
                     "checkpoint.enabled=false", "logging.wandb=false", "copy_head.head_dim=16",
                     *[f"parallel.{key}={value}" for key, value in layout.items()]]
        return Call(f"batch_path_{name}", w.training_batch_path, (overrides,))

    copy = {"heads": 2, "head_dim": 16, "impl": "chunked"}
    one = [Call("causality", w.causality), Call("no_candidates", w.no_candidate_positions),
           Call("distribution_tp1", w.distribution, (1,)), Call("disabled", w.disabled_is_plain_backbone),
           Call("spamlang", w.spamlang_learning, (40,)), Call("native_inference", w.native_inference),
           Call("sentinel_tp1", one_step, ({}, str(root / "sentinel-init"), None, SENTINEL, 4, True)),
           batch_path("tp1")]
    two = [Call("distribution_tp2", w.distribution, (2,)), batch_path("tp2-sp"), batch_path("pp2"),
           *[Call(f"bitwise_sp{sp}", one_step, ({"tp": 2, "sp": sp}, str(root / f"init-sp{sp}"), None, copy, 4, True))
             for sp in (False, True)],
           *[Call("sentinel_" + "".join(f"{k}{v}" for k, v in layout.items()), one_step,
                  (layout, str(root / "sentinel-init"), None, SENTINEL)) for layout in ({"tp": 2}, {"pp": 2})]]
    env = {"TMPDIR": str(tmp_path_factory.mktemp("streaming-tmp"))}  # the Trainer's streaming state
    with streaming_segments_removed(env["TMPDIR"]):
        return {**run_cases(one, 1, env=env), **run_cases(two, 2, env=env)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"tp": 1}, {"tp": 2, "sp": "true"}, {"pp": 2}], ids=["tp1", "tp2-sp", "pp2"])
def test_training_batch_path_gives_the_head_document_ids_without_document_masking(layout, runs, request):
    """data.document_masking=false (plain causal attention, as the SmolLM2/Llama recipes): the packed samples'
    document ids still reach the copy head, so the gate is exactly 0 at every document's first position."""
    calls = [call for r in runs[f"batch_path_{request.node.callspec.id}"] for call in r["calls"]]
    assert len(calls) == 2 * (layout.get("tp", 1))  # two micro-batches on each rank holding the head
    boundaries = 0
    for call in calls:
        tokens = call["tokens"]
        assert call["attention_mask"] is None  # plain causal attention over the packed row
        assert torch.equal(call["position_ids"], torch.arange(32).expand_as(tokens))  # integers
        starts = torch.zeros_like(tokens, dtype=torch.bool)  # from the tokens themselves: after an EOD
        starts[:, 0] = True
        starts[:, 1:] = tokens[:, :-1] == EOD
        boundaries += int(starts[:, 1:].sum())
        assert call["document_ids"] is not None
        assert (call["gate"][starts] == 0).all() and not call["has_candidate"][starts].any()
        inside = ~starts & call["has_candidate"]
        assert inside.sum() > tokens.numel() // 2 and (call["gate"][inside] > 0).all()
    assert boundaries >= 4 * len(calls)


@pytest.mark.slow
@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_copy_head_gradients_are_bitwise_identical_across_tp_ranks(sp, runs):
    """The head is replicated and its gradients are not reduced across TP ranks: every rank must compute
    exactly the same ones (same gathered hidden states, same all-reduced LM cross entropy) in a real step."""
    r0, r1 = runs[f"bitwise_sp{sp}"]
    assert r0["layout"] == (2, 1, 1)
    assert set(r0["head_grads"]) == {"copy_head.q_proj.weight", "copy_head.k_proj.weight", "copy_head.gate.weight",
                                     "copy_head.gate.bias"}
    for name, grad in r0["head_grads"].items():
        assert grad.abs().sum() > 0, name
        assert torch.equal(grad, r1["head_grads"][name]), name  # bitwise: the same inputs and ops on both ranks


@pytest.mark.slow
def test_megatron_native_inference_is_refused_with_the_copy_head(runs):
    [r] = runs["native_inference"]
    status, message = r["cplm"]
    assert status == "refused" and "not supported with the Copy-Paste head" in message and "convert_to_hf" in message
    assert r["baseline"][0] == "ok"  # the plain backbone keeps Megatron's inference path


def test_installed_megatron_core_has_a_supported_postprocess_signature():
    """Fails when a megatron-core release changes GPTModel._postprocess (run under every CI megatron-core)."""
    import inspect

    from megatron.core.models.gpt import GPTModel

    from cplm_megatron.model.cplm_gpt import POSTPROCESS_SIGNATURES, check_megatron_postprocess

    check_megatron_postprocess()
    params = tuple(inspect.signature(GPTModel._postprocess).parameters)[1:]
    assert params in POSTPROCESS_SIGNATURES.values()
    # the arguments the override reads by name exist in every supported release
    for known in POSTPROCESS_SIGNATURES.values():
        assert {"hidden_states", "input_ids", "labels", "loss_mask", "inference_context",
                "runtime_gather_output"} <= set(known)


def test_a_changed_postprocess_signature_stops_model_building_with_a_clear_error(monkeypatch):
    """Where the shim is used (0.16/0.17), a release that renames _postprocess's arguments fails at build time."""
    from megatron.core.models.gpt import GPTModel

    from cplm_megatron.errors import UserError
    from cplm_megatron.model.cplm_gpt import (
        USES_OUTPUT_PROCESSOR,
        CPLMGPTModel,
        UnsupportedMegatronError,
        check_megatron_postprocess,
    )

    def renamed(self, hidden_states, input_ids, position_ids, target_ids, rotary_pos_emb, rotary_pos_cos,
                rotary_pos_sin, mtp_in_postprocess=None, loss_mask=None):
        raise AssertionError("never called")

    with pytest.raises(UnsupportedMegatronError) as err:
        check_megatron_postprocess(renamed)
    message = str(err.value)
    assert isinstance(err.value, UserError)
    assert "megatron-core" in message and "0.16.1 ... 0.19.x" in message and "target_ids" in message
    if not USES_OUTPUT_PROCESSOR:
        monkeypatch.setattr(GPTModel, "_postprocess", renamed)
        with pytest.raises(UnsupportedMegatronError):
            CPLMGPTModel(config=None, transformer_layer_spec=None, vocab_size=8, max_sequence_length=8)


def test_the_head_uses_megatron_cores_public_hook_where_it_has_one():
    """megatron-core >= 0.18: GPTModel.forward(output_processor=...) and no private method of GPTModel
    overridden by a class of ours; 0.16/0.17: the _postprocess override lives in postprocess_shim.py only."""
    import inspect

    from megatron.core.models.gpt import GPTModel

    from cplm_megatron.model.cplm_gpt import USES_OUTPUT_PROCESSOR, CPLMGPTModel

    ours = [c for c in CPLMGPTModel.__mro__ if c.__module__.startswith("cplm_megatron")]
    overriding = [f"{c.__module__}.{c.__name__}" for c in ours if "_postprocess" in vars(c)]
    if "output_processor" in inspect.signature(GPTModel.forward).parameters:
        assert USES_OUTPUT_PROCESSOR and overriding == []
    else:
        assert not USES_OUTPUT_PROCESSOR
        assert overriding == ["cplm_megatron.model.postprocess_shim.PostprocessShim"]


@pytest.mark.slow
def test_sentinel_mixing_at_tp2_and_pp2_equals_tp1(runs):
    """`copy_head.mixing=sentinel` (one sentinel per copy head, reading each head's candidate lse) in a real
    train step: TP=2 and PP=2 (1F1B, 4 micro-batches) give TP=1's loss, gradient norm and copy-head gradients,
    and the replicated head's gradients are bit-identical on both TP ranks."""
    [ref] = runs["sentinel_tp1"]
    assert ref["head_grads"]["copy_head.gate.weight"].shape[0] == 2  # one sentinel per copy head
    assert ref["metrics"]["match_frac"] > 0 and 0 < ref["metrics"]["gate_mean"] < 1
    # fp32 everywhere; a layout changes only the order of the sums (tests/parallel/test_layouts.py): 1e-5
    rel = 1e-5
    for layout in ({"tp": 2}, {"pp": 2}):
        results = runs["sentinel_" + "".join(f"{k}{v}" for k, v in layout.items())]
        for r in results:
            assert abs(r["metrics"]["loss"] - ref["metrics"]["loss"]) <= rel * abs(ref["metrics"]["loss"]), layout
            assert abs(r["grad_norm"] - ref["grad_norm"]) <= rel * ref["grad_norm"], layout
        head = {k: v for r in results for k, v in r["head_grads"].items()}
        assert set(head) == set(ref["head_grads"]) and len(head) == 4
        for name, grad in ref["head_grads"].items():
            assert grad.abs().sum() > 0, name
            assert (head[name] - grad).norm() <= rel * grad.norm() + 1e-12, (layout, name)
        if "tp" in layout:
            for name, grad in results[0]["head_grads"].items():  # bitwise: same inputs and ops on both ranks
                assert torch.equal(grad, results[1]["head_grads"][name]), name
