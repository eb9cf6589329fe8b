"""Model presets: exact SmolLM2 and Qwen3 counts, an independent HF count, the Megatron model built on meta."""

import pytest
import torch

from cplm_megatron.errors import ConfigError
from cplm_megatron.model.config import available_presets, load_preset
from cplm_megatron.model.sizing.accounting import CopyHeadShape, backbone_params, copy_head_params
from tests.harness import run_distributed

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

SMOLLM2 = {"smollm2-135m": 134_515_008, "smollm2-360m": 361_821_120, "smollm2-1.7b": 1_711_376_384}
# Qwen/Qwen3-*: the hub's safetensors counts (751,632,384 and 2,031,739,904) store the tied lm_head again
QWEN3 = {"qwen3-0.6b": 596_049_920, "qwen3-1.7b": 1_720_574_976}


def hf_param_count(name: str) -> int:
    """Independent count: the matching transformers model instantiated on the meta device."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen3Config

    m = load_preset(name)
    if m.family == "qwen3":
        cfg = Qwen3Config(vocab_size=m.padded_vocab_size, hidden_size=m.hidden_size, head_dim=m.head_dim,
                          intermediate_size=m.ffn_hidden_size, num_hidden_layers=m.num_layers,
                          num_attention_heads=m.num_attention_heads, num_key_value_heads=m.kv_heads,
                          tie_word_embeddings=m.tie_embeddings, max_position_embeddings=m.max_position_embeddings)
    elif m.family == "llama":
        cfg = LlamaConfig(vocab_size=m.padded_vocab_size, hidden_size=m.hidden_size,
                          intermediate_size=m.ffn_hidden_size, num_hidden_layers=m.num_layers,
                          num_attention_heads=m.num_attention_heads, num_key_value_heads=m.kv_heads,
                          tie_word_embeddings=m.tie_embeddings, max_position_embeddings=m.max_position_embeddings)
    else:
        cfg = GPT2Config(vocab_size=m.padded_vocab_size, n_embd=m.hidden_size, n_layer=m.num_layers,
                         n_head=m.num_attention_heads, n_inner=m.ffn_hidden_size, n_positions=m.max_position_embeddings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())  # tied weights are one Parameter


@pytest.mark.parametrize("name, expected", sorted(SMOLLM2.items()))
def test_smollm2_counts_exact(name, expected):
    assert backbone_params(load_preset(name)) == expected


@pytest.mark.parametrize("name, expected", sorted(QWEN3.items()))
def test_qwen3_counts_exact(name, expected):
    m = load_preset(name)
    assert backbone_params(m) == expected
    assert backbone_params(m) - m.padded_vocab_size * m.hidden_size == {"qwen3-0.6b": 440_467_456,
                                                                        "qwen3-1.7b": 1_409_410_048}[name]


@pytest.mark.parametrize("name", available_presets())
def test_analytic_count_matches_transformers(name):
    assert backbone_params(load_preset(name)) == hf_param_count(name)


def test_copy_head_count_formula():
    m = load_preset("smollm2-135m")
    assert copy_head_params(m, CopyHeadShape(4, 64)) == 2 * 576 * 4 * 64 + 576 + 1
    assert copy_head_params(m, CopyHeadShape(4, 64, qk_norm=True)) == 2 * 576 * 4 * 64 + 576 + 1 + 2 * 64


def test_presets_cover_the_families():
    names = set(available_presets())
    assert {"smollm2-135m", "smollm2-360m", "smollm2-1.7b", "tiny", "tiny-gpt2", "gpt2-124m"} <= names
    assert {"llama-3b", "llama-7b", "llama-13b"} <= names
    gpt2 = load_preset("gpt2-124m")
    assert (gpt2.normalization, gpt2.activation, gpt2.position_embedding, gpt2.add_bias_linear) == \
        ("LayerNorm", "gelu", "learned_absolute", True)


def test_qwen3_presets_have_its_architecture():
    for name in ("qwen3-0.6b", "qwen3-1.7b", "tiny-qwen3"):
        m = load_preset(name)
        assert (m.family, m.qk_norm, m.rope_theta, m.norm_eps) == ("qwen3", True, 1e6, 1e-6), name
        assert m.head_dim * m.num_attention_heads != m.hidden_size or name == "qwen3-1.7b", name
    assert (load_preset("qwen3-0.6b").head_dim, load_preset("qwen3-0.6b").kv_heads) == (128, 8)
    assert not load_preset("tiny").qk_norm and not load_preset("gpt2-124m").qk_norm


def test_unknown_family_is_one_line_naming_the_known_ones():
    with pytest.raises(ConfigError) as err:
        load_preset("tiny", family="mamba")
    assert str(err.value) == "unknown model.family 'mamba'; known families: gpt2, llama, qwen3"


def test_bad_preset_values():
    with pytest.raises(ConfigError, match="model.hidden_size=100 is not divisible by model.num_attention_heads=3"):
        load_preset("tiny", hidden_size=100, num_attention_heads=3, num_query_groups=1)
    with pytest.raises(ConfigError, match="num_attention_heads=4 is not divisible by model.num_query_groups=3"):
        load_preset("tiny", num_query_groups=3)


def _build_all(rank: int) -> dict:
    """Every preset built by megatron-core on the meta device, in a fresh process: counts and RSS growth."""
    import resource

    from cplm_megatron.model.config import available_presets
    from cplm_megatron.model.sizing.accounting import CopyHeadShape
    from cplm_megatron.model.sizing.info import count_built_params
    out = {}
    for name in available_presets():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out[name] = count_built_params(load_preset(name), CopyHeadShape(4, 64))
        out[name]["rss_growth_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    return out


@pytest.mark.slow
def test_megatron_models_built_on_meta_match_and_allocate_nothing():
    [built] = run_distributed(_build_all, 1)
    for name, counts in built.items():
        m = load_preset(name)
        assert counts["backbone"] == backbone_params(m), name
        assert counts["copy_head"] == copy_head_params(m, CopyHeadShape(4, 64)), name
    assert built["llama-13b"]["total"] > 13e9
    assert built["llama-13b"]["rss_growth_mib"] < 300  # 13B fp32 would be ~49 GiB


def test_tiny_qwen3_recipe_is_the_tiny_recipe_with_the_qwen3_backbone():
    from cplm_megatron.config.loader import recipe_path
    from cplm_megatron.run_config import load_run_config

    tiny, qwen3 = (load_run_config(recipe_path(name), []).to_dict() for name in ("tiny", "tiny_qwen3"))
    assert qwen3["model"]["family"] == "qwen3" and qwen3["model"]["preset"] == "tiny-qwen3"
    assert qwen3["copy_head"]["enabled"] is True
    assert {k: v for k, v in qwen3.items() if k not in ("model", "run")} == \
        {k: v for k, v in tiny.items() if k not in ("model", "run")}
