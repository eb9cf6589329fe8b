"""Qwen3 through the backbone registry: random tiny Qwen3ForCausalLM -> Megatron (qk-norm built by megatron-core)
-> HF, tied and untied, head_dim != hidden/heads, GQA, RoPE base 1e6.

- Megatron's logits at TP=1 equal HF's (two independent fp32 implementations; the only check that Megatron's
  q/k layernorm is HF's q_norm/k_norm, placed before RoPE).
- The round trip gives the original tensors bitwise and the reloaded Qwen3ForCausalLM identical logits.
- Fast: a Qwen3-0.6B-shaped HF config imports as the qwen3-0.6b preset; with the copy head the export config is a
  CPLMConfig over Qwen3 (cplm_backbone) that imports back as the same model, and an HF Qwen3 CPLM's tensors map to
  Megatron and back bitwise with its trained copy head; unsupported Qwen3 variants are one clear error each.
  (The CPLM export's numerics and generation: test_hf_export.py, test_convert_to_hf.py.)
"""

import dataclasses
from pathlib import Path

import megatron_workers as mw
import pytest
import torch
from hf_testing import BACKBONE, QWEN3, VOCAB_SIZE, cplm_config, randomize_norms, tiny_cplm
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

from cplm_megatron.hf.config_mapping import (
    ConversionError,
    check_exportable,
    check_preset_matches,
    copy_head_config_from_hf,
    hf_config_from_megatron,
    model_config_from_hf,
)
from cplm_megatron.hf.convert import convert_to_hf
from cplm_megatron.model.config import load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig
from tests.dist_utils import run_distributed

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

PADDED_VOCAB = 384  # VOCAB_SIZE=300 rounded up to the pad multiple 128
# Two independent fp32 implementations of a hidden-64, 2-layer, 300-token model (Megatron's fused QKV, torch
# RMSNorm for q/k, its own RoPE tables vs HF's): other summation orders in every matmul and softmax give ~1e-5
# relative on |logits| <~ 10 (as tests/hf/test_convert_from_hf.py allows for Llama) -> 1e-4. Measured on
# megatron-core 0.16.1 / transformers 5.24: 0 (the same CPU kernels on these shapes); q_norm and k_norm swapped: 0.11
ATOL = 1e-4
QWEN3_BACKBONE = {**BACKBONE, "head_dim": 24, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}


def qwen3(seed: int, **overrides) -> Qwen3ForCausalLM:
    """A random tiny Qwen3 whose q/k norms (and every other norm) are away from 1."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**QWEN3_BACKBONE, **overrides})).eval()
    randomize_norms(model, seed)
    return model


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> dict:
    """Tied and untied Qwen3 sources converted to Megatron and scored there in one process."""
    root = tmp_path_factory.mktemp("qwen3")
    models = {"tied": qwen3(0, tie_word_embeddings=True), "untied": qwen3(1, tie_word_embeddings=False)}
    sources = {}
    for name, model in models.items():
        model.save_pretrained(root / "hf" / name)
        sources[name] = root / "hf" / name
    batches = [torch.randint(0, VOCAB_SIZE, (2, mw.SEQ_LEN), generator=torch.Generator().manual_seed(s))
               for s in (2, 3)]
    jobs = [{"hf_dir": str(sources[name]), "output": str(root / name)} for name in models]
    [logits] = run_distributed(mw.convert_and_score, 1, jobs, batches)
    return {"root": root, "models": models, "batches": batches,
            "logits": {name: logits[str(root / name)] for name in models}}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tied", "untied"])
def test_megatron_logits_equal_hf(converted: dict, name: str) -> None:
    worst = 0.0
    for ids, logits in zip(converted["batches"], converted["logits"][name]):
        with torch.no_grad():
            expected = converted["models"][name](ids).logits
        assert logits.shape == (*ids.shape, PADDED_VOCAB)
        assert torch.equal(logits[..., VOCAB_SIZE:], torch.zeros_like(logits[..., VOCAB_SIZE:]))  # zero-filled rows
        worst = max(worst, (logits[..., :VOCAB_SIZE] - expected).abs().max().item())
    print(f"Qwen3 {name}: Megatron vs HF max |logit diff| {worst:.3g}")
    assert worst <= ATOL


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tied", "untied"])
def test_round_trip_gives_identical_weights_and_logits(converted: dict, name: str, tmp_path: Path,
                                                      tokenizer_dir: Path) -> None:
    out = convert_to_hf(converted["root"] / name, tmp_path / "hf", tokenizer=tokenizer_dir)
    original = converted["models"][name]
    state = original.state_dict()
    back = load_file(str(out / "model.safetensors"))
    assert set(back) == set(state) - ({"lm_head.weight"} if name == "tied" else set())  # tied: stored once
    assert sum("q_norm" in key or "k_norm" in key for key in back) == 2 * QWEN3_BACKBONE["num_hidden_layers"]
    for key, tensor in back.items():
        assert torch.equal(tensor, state[key]), key  # HF -> Megatron -> HF only copies and reshapes fp32
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is Qwen3ForCausalLM
    assert (reloaded.config.head_dim, reloaded.config.rope_parameters["rope_theta"]) == (24, 1_000_000.0)
    ids = converted["batches"][0]
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, original(ids).logits)


# ----------------------------------------------------------------------------- fast: configs and errors
def test_qwen3_0p6b_config_imports_as_its_preset() -> None:
    hf = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                     rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
    derived = model_config_from_hf(hf, "config.json")
    assert derived.family == "qwen3" and derived.qk_norm
    assert check_preset_matches("qwen3-0.6b", derived, "config.json") == load_preset("qwen3-0.6b")


def test_export_config_is_qwen3s() -> None:
    m = load_preset("tiny-qwen3")
    hf = hf_config_from_megatron(m, None)
    assert type(hf) is Qwen3Config and hf.layer_types == ["full_attention"] * m.num_layers
    assert (hf.head_dim, hf.num_key_value_heads, hf.tie_word_embeddings) == (48, 2, False)
    assert model_config_from_hf(hf, "x") == dataclasses.replace(m, preset="")
    cplm = hf_config_from_megatron(m, CopyHeadConfig(heads=3, head_dim=16))
    assert (cplm.model_type, cplm.cplm_backbone, cplm.copy_heads) == ("cplm", "qwen3", 3)
    assert (cplm.head_dim, cplm.layer_types, cplm.rope_parameters) == (hf.head_dim, hf.layer_types, hf.rope_parameters)
    assert model_config_from_hf(cplm, "x") == dataclasses.replace(m, preset="")  # imports as the qwen3 family


def test_a_qwen3_cplm_maps_both_ways_with_its_trained_copy_head() -> None:
    """An HF CPLM over Qwen3 (what convert_to_hf writes) imports as the qwen3 family with its copy head, and its
    tensors map to Megatron's and back bitwise (q/k norms of the decoder and of the copy head included)."""
    from cplm_megatron.hf.weight_mapping import hf_to_megatron, megatron_to_hf

    hf = tiny_cplm(cplm_config(**QWEN3, copy_qk_norm=True), seed=5)
    randomize_norms(hf, seed=5)
    model = model_config_from_hf(hf.config, "config.json")
    copy = copy_head_config_from_hf(hf.config, enabled=True)
    assert (model.family, model.head_dim, model.rope_theta, model.tie_embeddings) == ("qwen3", 24, 1e6, False)
    assert (copy.heads, copy.head_dim, copy.qk_norm) == (3, 16, True)
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    tensors = hf_to_megatron(state, model, copy)
    assert tensors["decoder.layers.self_attention.q_layernorm.weight"].shape == (2, 24)
    back = megatron_to_hf(tensors, model, copy)
    assert set(back) == set(state)
    for key, value in back.items():
        assert torch.equal(value, state[key]), key  # bitwise: the mapping only reshapes and copies


def test_unsupported_qwen3_variants_are_clear_errors() -> None:
    with pytest.raises(ConversionError, match="sliding_window=64"):
        model_config_from_hf(Qwen3Config(**QWEN3_BACKBONE, use_sliding_window=True, sliding_window=64,
                                         max_window_layers=0), "config.json")
    with pytest.raises(ConversionError, match="attention_bias=True"):
        model_config_from_hf(Qwen3Config(**QWEN3_BACKBONE, attention_bias=True), "config.json")
    check_exportable(load_preset("tiny-qwen3"), CopyHeadConfig())  # CPLMForCausalLM over Qwen3Model
    with pytest.raises(ConversionError, match=r"exported \(CPLMForCausalLM\) with the llama, qwen3 families; this "
                                              "gpt2-family checkpoint"):
        check_exportable(load_preset("tiny-gpt2"), CopyHeadConfig())
    with pytest.raises(ConversionError, match="unknown model.family 'mamba'; known families: gpt2, llama, qwen3"):
        check_exportable(load_preset("tiny").__class__(family="mamba"), None)
