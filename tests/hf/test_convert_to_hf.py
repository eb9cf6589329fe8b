"""convert_to_hf: trainer checkpoints saved at TP=2, at PP=2 and at PP=2 x VPP=2 export to HF models
that compute what Megatron computes (fp32): CPLM mixture log-probs within 1e-4 (measured ~3e-6), raw
logits of plain Llama (untied, padded vocab) and GPT-2 backbones within 1e-4 (measured <1e-6).

The Megatron side runs in the saving layout's own processes, through Megatron's pipeline schedule
(one pair of processes for all checkpoints: tests using the `saved` fixture are marked slow).
"""

import json
import shutil
from pathlib import Path

import megatron_workers as mw
import pytest
import torch
from transformers import AutoModelForCausalLM

from cplm_megatron.checkpoint.lookup import resolve_checkpoint
from cplm_megatron.data.tokenizer import describe_tokenizer
from cplm_megatron.errors import CheckpointError
from cplm_megatron.hf.config_mapping import ConversionError, check_exportable
from cplm_megatron.hf.convert import convert_to_hf
from cplm_megatron.model.config import load_preset
from cplm_megatron.model.copy_head import CopyHeadConfig
from tests.data_fixtures import write_synthetic_dataset
from tests.dist_utils import run_distributed

pytestmark = [pytest.mark.mcore, pytest.mark.mcore_latest]  # the HF export of every layout on both legs

# two independent fp32 implementations (Megatron in the saving layout vs HF) of the tiny preset (hidden 128,
# ffn 384, 4 layers, vocab ~4096): other summation orders in every matmul and softmax plus separately computed
# RoPE tables (angles < 64 rad rounded at 2^-24) give ~1e-5 relative on |logits|, |log p| <~ 10 -> 1e-4
ATOL = 1e-4
# one fp32 model over a KV cache vs over the whole prefix (tiny-qwen3: ffn 384, |log p| <~ 10): attention and copy
# sums in other orders, random-walk rounding ~sqrt(384) * 2^-24 * 10 ~ 1e-5 -> 5e-5 (measured 2e-6)
GENERATION_ATOL = 5e-5
COPY_HEAD = ["copy_head.heads=3", "copy_head.head_dim=16", "copy_head.qk_norm=true"]
CPLM = ["model.preset=tiny", *COPY_HEAD]
CPLM_QWEN3 = ["model.preset=tiny-qwen3", *COPY_HEAD]  # qk-norm, head_dim 48 != 128/4, untied, RoPE base 1e6
PADDED_VOCAB = 4000  # not a multiple of 128: the 96 padded rows must be dropped
LLAMA_UNTIED = ["model.preset=tiny", "model.tie_embeddings=false", f"model.vocab_size={PADDED_VOCAB}",
                "copy_head.enabled=false"]
GPT2 = ["model.preset=tiny-gpt2", f"model.vocab_size={PADDED_VOCAB}", "copy_head.enabled=false"]


def variant(overrides: list[str], output: str, seed: int, vocab: int = 4096) -> dict:
    return {"overrides": overrides, "batches": mw.random_batches(2, 2, vocab, seed), "output": output}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """The corpus layout: <root>/tokenizer and a dataset <root>/train whose manifest records that tokenizer."""
    root = tmp_path_factory.mktemp("corpus")
    shutil.copytree(tokenizer_dir, root / "tokenizer")
    write_synthetic_dataset(root / "train", [[5, 6, 7, 8]] * 40, seq_len=16,
                            tokenizer=describe_tokenizer(root / "tokenizer"))
    return root


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> dict:
    """Checkpoints saved at TP=2 and at PP=2 (2 processes) with the Megatron scores of their batches."""
    root = tmp_path_factory.mktemp("megatron")
    streams = [f"data.streams=[{data_root / 'train'}]"]
    variants = {  # one pair of processes: the TP=2 layout first, then PP=2, then PP=2 x VPP=2, then TP=2 again
        "cplm_tp2": {**variant(CPLM + ["parallel.tp=2"] + streams, "log_probs", seed=1), "with_optimizer": True},
        "llama_untied_tp2": variant(LLAMA_UNTIED + ["parallel.tp=2"], "logits", seed=2, vocab=PADDED_VOCAB),
        "gpt2_tp2": variant(GPT2 + ["parallel.tp=2"], "logits", seed=3, vocab=PADDED_VOCAB),
        "gpt2_with_copy_head": variant(["model.preset=tiny-gpt2", "parallel.tp=2"], "logits", seed=4),
        "cplm_pp2": variant(CPLM + ["parallel.pp=2"], "log_probs", seed=5),
        "cplm_pp2_vpp2": variant(CPLM + ["parallel.pp=2", "parallel.vpp=2"], "log_probs", seed=7),
        # random gate weights (randomize_constant_init) that the constant rule must ignore on both sides
        "cplm_constant_tp2": variant(CPLM + ["copy_head.mixing=constant", "parallel.tp=2"], "log_probs", seed=8),
        # one sentinel per copy head (gate [3, d]); the mixture reads each head's candidate lse on both sides
        "cplm_sentinel_tp2": variant(CPLM + ["copy_head.mixing=sentinel", "parallel.tp=2"], "log_probs", seed=9),
        "llama_untied_pp2": variant(LLAMA_UNTIED + ["parallel.pp=2"], "logits", seed=6, vocab=PADDED_VOCAB),
        "cplm_qwen3_tp2": variant(CPLM_QWEN3 + ["parallel.tp=2"], "log_probs", seed=10),
    }
    results = run_distributed(mw.save_and_score, 2, variants, str(root))
    scores = {name: next(r[name] for r in results if r[name] is not None) for name in variants}
    return {"root": root, "variants": variants, "scores": scores}


def export(saved: dict, name: str, tmp_path: Path, tokenizer: Path | None) -> AutoModelForCausalLM:
    out = convert_to_hf(saved["root"] / name, tmp_path / name, tokenizer=tokenizer)
    return AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()


def max_diff(model: AutoModelForCausalLM, saved: dict, name: str, vocab: int) -> float:
    """Largest |HF logits - Megatron output| over the variant's batches (Megatron's padded columns cut)."""
    worst = 0.0
    with torch.no_grad():
        for ids, expected in zip(saved["variants"][name]["batches"], saved["scores"][name]):
            got = model(ids).logits
            assert got.shape == (*ids.shape, vocab)
            worst = max(worst, (got - expected[..., :vocab]).abs().max().item())
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cplm_tp2", "cplm_pp2", "cplm_pp2_vpp2", "cplm_constant_tp2", "cplm_sentinel_tp2"])
def test_cplm_logits_equal_megatron_mixture_log_probs(saved: dict, name: str, tmp_path: Path, tokenizer_dir: Path) -> None:
    """Megatron scores with the loader's document ids (a new document after each EOD, id 0 here, frequent in
    the batches); the export resets copy candidates at the tokenizer's EOD: the same distribution."""
    model = export(saved, name, tmp_path, tokenizer_dir)  # cplm_tp2 also holds optimizer state (not read)
    assert type(model).__name__ == "CPLMForCausalLM"
    assert (model.config.copy_heads, model.config.copy_head_dim, model.config.copy_qk_norm) == (3, 16, True)
    assert (model.config.copy_eod_token_id, model.config.copy_reset_at_eod) == (mw.EOD_ID, True)
    assert model.config.copy_mixing == next((m for m in ("constant", "sentinel") if m in name), "gate")
    assert model.copy_head.gate.weight.shape == (3 if "sentinel" in name else 1, model.config.hidden_size)
    assert all((ids == mw.EOD_ID).any() for ids in saved["variants"][name]["batches"])
    assert model.config.num_key_value_heads == 2 and model.config.tie_word_embeddings
    diff = max_diff(model, saved, name, 4096)
    print(f"{name}: max |HF - Megatron| mixture log-prob = {diff:.3g}")
    assert diff <= ATOL


@pytest.mark.slow
def test_qwen3_cplm_exports_loads_and_generates_with_the_cache_as_without(saved: dict, tmp_path: Path,
                                                                         tokenizer_dir: Path) -> None:
    """A Qwen3-backbone CPLM saved at TP=2 exports as CPLMForCausalLM over transformers' Qwen3Model (the backbone
    spec's HF class; cplm_backbone: qwen3), loads with trust_remote_code, computes Megatron's mixture log-probs, and
    generates greedily with the KV cache as without it."""
    name = "cplm_qwen3_tp2"
    model = export(saved, name, tmp_path, tokenizer_dir)
    assert (type(model).__name__, type(model.model).__name__, model.config.cplm_backbone) == (
        "CPLMForCausalLM", "Qwen3Model", "qwen3")
    assert (model.config.head_dim, model.config.tie_word_embeddings, model.config.copy_eod_token_id) == (
        48, False, mw.EOD_ID)
    diff = max_diff(model, saved, name, 4096)
    print(f"{name}: max |HF - Megatron| mixture log-prob = {diff:.3g}")
    assert diff <= ATOL
    prompt = saved["variants"][name]["batches"][0][:, :12]
    runs = [model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                           use_cache=cache, return_dict_in_generate=True, output_logits=True,
                           pad_token_id=model.generation_config.pad_token_id) for cache in (True, False)]
    cached, uncached = runs
    # integer tokens: argmaxes of log-probs that agree within GENERATION_ATOL (no closer tie in these prompts)
    assert torch.equal(cached.sequences, uncached.sequences) and cached.sequences.shape[1] > prompt.shape[1] + 1
    gap = (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max().item()
    print(f"{name}: max |cached - uncached| step log-prob = {gap:.3g}")
    assert gap <= GENERATION_ATOL


@pytest.mark.slow
@pytest.mark.parametrize("name, architecture", [("llama_untied_tp2", "LlamaForCausalLM"),
                                                ("llama_untied_pp2", "LlamaForCausalLM"),
                                                ("gpt2_tp2", "GPT2LMHeadModel")])
def test_plain_backbone_logits_equal_megatron(saved: dict, name: str, architecture: str, tmp_path: Path,
                                              tokenizer_dir: Path) -> None:
    model = export(saved, name, tmp_path, tokenizer_dir)
    assert type(model).__name__ == architecture and model.config.vocab_size == PADDED_VOCAB
    diff = max_diff(model, saved, name, PADDED_VOCAB)
    print(f"{name}: max |HF - Megatron| logit = {diff:.3g}")
    assert diff <= ATOL
    config = json.loads((tmp_path / name / "config.json").read_text())
    assert not config["tie_word_embeddings"] if name.startswith("llama") else config["tie_word_embeddings"]
    if architecture == "GPT2LMHeadModel":
        assert config["activation_function"] == "gelu" and config["n_positions"] == mw.SEQ_LEN


@pytest.mark.slow
def test_tokenizer_found_from_the_training_data(saved: dict, tmp_path: Path, data_root: Path) -> None:
    out = convert_to_hf(saved["root"] / "cplm_tp2", tmp_path / "hf", tokenizer=None)
    assert (out / "tokenizer.json").read_bytes() == (data_root / "tokenizer" / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_checkpoint_path_forms_and_dtype(saved: dict, tmp_path: Path, tokenizer_dir: Path) -> None:
    root = saved["root"] / "llama_untied_tp2"
    iter_dir = root / "iter_0000007"
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("iter_0000007\n")
    (run_dir / "checkpoints" / "iter_0000007").symlink_to(iter_dir)
    assert resolve_checkpoint(root).path == iter_dir and resolve_checkpoint(iter_dir).path == iter_dir
    assert resolve_checkpoint(run_dir).path == run_dir / "checkpoints" / "iter_0000007"
    out = convert_to_hf(run_dir, tmp_path / "bf16", tokenizer=tokenizer_dir, dtype="bf16")
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.dtype == torch.bfloat16 and json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.slow
def test_missing_tokenizer_is_a_clear_error(saved: dict, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="missing tokenizer.*pass --tokenizer"):
        convert_to_hf(saved["root"] / "cplm_pp2", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_not_a_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    # the one checkpoint lookup of training, evaluation and conversion (checkpoint/lookup.py)
    with pytest.raises(CheckpointError, match="no complete checkpoint under .*did the training run save one"):
        convert_to_hf(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(CheckpointError, match="does not exist"):
        convert_to_hf(tmp_path / "nowhere", tmp_path / "out")


@pytest.mark.slow
def test_gpt2_checkpoint_with_copy_head_is_a_clear_error(saved: dict, tmp_path: Path, tokenizer_dir: Path) -> None:
    with pytest.raises(ConversionError, match=r"Copy-Paste head is exported \(CPLMForCausalLM\) with the llama, "
                                              "qwen3 families; this gpt2-family"):
        convert_to_hf(saved["root"] / "gpt2_with_copy_head", tmp_path / "hf", tokenizer=tokenizer_dir)
    assert not (tmp_path / "hf").exists()


def test_unsupported_architectures_are_clear_errors() -> None:
    with pytest.raises(ConversionError, match=r"llama-family model with model.normalization='LayerNorm'"):
        check_exportable(load_preset("tiny", normalization="LayerNorm"), None)
    with pytest.raises(ConversionError, match="no grouped-query attention"):
        check_exportable(load_preset("tiny-gpt2", num_query_groups=2), None)
    with pytest.raises(ConversionError, match="model.add_bias_linear=True"):
        check_exportable(load_preset("tiny", add_bias_linear=True), CopyHeadConfig())


def test_a_checkpoint_pruned_while_converting_is_replaced_by_the_newest(tmp_path: Path, tokenizer_dir: Path,
                                                                         monkeypatch, caplog) -> None:
    """A run still training moves `latest` to iter_0000006 and prunes iter_0000004 while convert_to_hf reads it
    (keep=2): the conversion retries with the newest complete checkpoint; an iter_* dir named explicitly is not
    replaced, and the error names the newest (never a fresh start while complete checkpoints exist)."""
    import cplm_megatron.hf.convert as convert
    from tests.checkpoint.checkpoint_files import tiny_config, write_checkpoints

    root = write_checkpoints(tiny_config(tmp_path / "run", "model.vocab_size=4096"), [2, 4, 6])
    real_read = convert.read_tensors
    reads = []

    def read_while_training(iter_dir, keys):  # the trainer's next save lands and prunes the one being read
        reads.append(iter_dir.name)
        if iter_dir.name == "iter_0000004":
            (root / "latest").write_text("iter_0000006\n")
            shutil.rmtree(iter_dir)
        return real_read(iter_dir, keys)

    monkeypatch.setattr(convert, "read_tensors", read_while_training)
    (root / "latest").write_text("iter_0000004\n")
    shutil.copytree(root / "iter_0000004", tmp_path / "iter_0000004_copy")
    out = convert_to_hf(tmp_path / "run", tmp_path / "hf", tokenizer=tokenizer_dir)
    assert reads == ["iter_0000004", "iter_0000006"] and (out / "config.json").is_file()
    assert "iter_0000004 was removed while being read (pruned by the run still training): retrying with the " \
           "newest complete checkpoint iter_0000006" in caplog.text
    shutil.copytree(tmp_path / "iter_0000004_copy", root / "iter_0000004")
    with pytest.raises(CheckpointError) as explicit:
        convert_to_hf(root / "iter_0000004", tmp_path / "hf2", tokenizer=tokenizer_dir)
    assert f"read the newest complete one: {root / 'iter_0000006'}" in str(explicit.value)
    assert "overwrite" not in str(explicit.value) and not (tmp_path / "hf2").exists()
