"""write_hf_checkpoint: exported directories reload offline in a fresh process with identical logits."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from hf_testing import (
    BOS_EOS_ID,
    PAD_ID,
    QWEN3,
    STEP_ATOL,
    VOCAB_SIZE,
    assert_logits_are_the_models,
    cplm_config,
    llama_config_like,
    randomize_norms,
    repetitive_ids,
    tiny_cplm,
)
from safetensors import safe_open
from transformers import (
    AutoTokenizer,
    BertConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
)

from cplm_megatron.evaluation.tasks.lmeval import offline_env
from cplm_megatron.hf.export import with_legacy_rope_fields, write_hf_checkpoint
from cplm_megatron.model import mixing

LOADER = Path(__file__).with_name("hf_load_exported.py")
TEXT = "the quick brown fox copy paste"


def saved_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118 (not iterable)
    return tensors


def tiny_qwen3_cplm() -> torch.nn.Module:
    """A CPLM over a Qwen3 decoder, untied, every norm (q/k norms included) away from 1."""
    model = tiny_cplm(cplm_config(**QWEN3, copy_qk_norm=True), seed=7, gate_bias=1.0)
    randomize_norms(model, seed=7)
    return model


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(5)
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                        bos_token_id=BOS_EOS_ID, eos_token_id=BOS_EOS_ID)
    return GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> dict:
    """Export seven variants, reload all of them in one fresh offline process (the Qwen3 CPLM also generates
    there); return models, dirs, results."""
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    plain_llama = LlamaForCausalLM(llama_config_like(cplm_config(tie_word_embeddings=True))).eval()
    models = {
        "cplm": tiny_cplm(cplm_config(copy_qk_norm=True, rope_theta=50000.0), seed=1),
        "cplm_tied_sharded": tiny_cplm(cplm_config(tie_word_embeddings=True), seed=2),
        "cplm_bf16": tiny_cplm(cplm_config(), seed=3),
        "cplm_constant": tiny_cplm(cplm_config(copy_mixing="constant"), seed=6, gate_bias=1.0),
        "cplm_qwen3": tiny_qwen3_cplm(),
        "llama": plain_llama,
        "gpt2": tiny_gpt2(),
    }
    options = {"cplm_tied_sharded": {"max_shard_bytes": 60_000}, "cplm_bf16": {"dtype": torch.bfloat16}}
    dirs = {}
    for name, model in models.items():
        dirs[name] = write_hf_checkpoint(root / name, model.config, model.state_dict(), tokenizer_dir,
                                         **options.get(name, {}))
    input_ids = repetitive_ids(2, 12, seed=4)
    input_ids[:, 6] = BOS_EOS_ID  # a document boundary: the reloaded code resets copy candidates there too
    request = {"dirs": [str(d) for d in dirs.values()], "input_ids": input_ids, "text": TEXT,
               "generate": {str(dirs["cplm_qwen3"]): repetitive_ids(2, 7, seed=1)}}
    torch.save(request, root / "request.pt")
    proc = subprocess.run(
        [sys.executable, str(LOADER), str(root / "request.pt"), str(root / "result.pt")],
        env=offline_env(root / "hf_home"), capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(root / "result.pt")
    return {"models": models, "dirs": dirs, "input_ids": input_ids,
            "results": {name: results[str(d)] for name, d in dirs.items()}}


def test_cplm_reloads_with_remote_code_and_identical_logits(exported: dict, tokenizer_dir: Path) -> None:
    model, model_dir, result = (exported[k]["cplm"] for k in ("models", "dirs", "results"))
    assert result["class"] == "CPLMForCausalLM"
    assert_logits_are_the_models(result["logits"], model, exported["input_ids"])
    config = json.loads((model_dir / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_cplm.CPLMConfig",
        "AutoModelForCausalLM": "modeling_cplm.CPLMForCausalLM",
    }
    assert config["architectures"] == ["CPLMForCausalLM"] and config["model_type"] == "cplm"
    assert config["rope_theta"] == 50000.0  # also readable by transformers 4.x, which ignores rope_parameters
    assert (model_dir / "modeling_cplm.py").is_file() and (model_dir / "configuration_cplm.py").is_file()
    # the mixing rule ships as training's own module; the EOD of the tokenizer resets copy candidates
    assert (model_dir / "mixing.py").read_bytes() == Path(mixing.__file__).read_bytes()
    assert (config["copy_mixing"], config["copy_eod_token_id"], config["copy_reset_at_eod"]) == ("gate", BOS_EOS_ID,
                                                                                                 True)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (
        BOS_EOS_ID, BOS_EOS_ID, PAD_ID)
    assert result["token_ids"] == AutoTokenizer.from_pretrained(str(tokenizer_dir))(TEXT).input_ids
    assert set(saved_tensors(model_dir)) == set(model.state_dict())


def test_qwen3_cplm_reloads_with_remote_code_and_generates_with_the_cache_as_without(exported: dict) -> None:
    """CPLMForCausalLM over the backbone spec's decoder (cplm_backbone: qwen3 -> Qwen3Model), reloaded with
    trust_remote_code in a fresh process: the model's log-probs, and greedy generation with the KV cache (copy-key
    state beside it) equal to generation without."""
    model, model_dir, result = (exported[k]["cplm_qwen3"] for k in ("models", "dirs", "results"))
    assert (result["class"], result["decoder"]) == ("CPLMForCausalLM", "Qwen3Model")
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["cplm_backbone"], config["head_dim"]) == ("cplm", "qwen3", 24)
    assert config["layer_types"] == ["full_attention"] * 2 and config["rope_theta"] == 1_000_000.0
    tensors = saved_tensors(model_dir)
    assert set(tensors) == set(model.state_dict())  # untied: lm_head.weight too
    assert sum("q_norm" in k or "k_norm" in k for k in tensors) == 2 * 2 + 2  # 2 layers' q/k norms + the copy head's
    assert_logits_are_the_models(result["logits"], model, exported["input_ids"])
    cached, uncached = result["generated"]["cached"], result["generated"]["uncached"]
    # integer tokens: argmaxes of log-probs that agree within STEP_ATOL (no closer tie in this prompt)
    assert torch.equal(cached["sequences"], uncached["sequences"]) and cached["sequences"].shape[1] > 7 + 1
    torch.testing.assert_close(cached["logits"], uncached["logits"], atol=STEP_ATOL, rtol=0)


def test_exported_directory_serves_as_tokenizer_dir(exported: dict, tmp_path: Path) -> None:
    """Re-export with an exported CPLM directory (config.json with auto_map) as the tokenizer source."""
    model, model_dir = exported["models"]["cplm"], exported["dirs"]["cplm"]
    again = write_hf_checkpoint(tmp_path / "again", model.config, model.state_dict(), model_dir)
    assert (again / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_tied_embeddings_stored_once_across_shards(exported: dict) -> None:
    model, model_dir, result = (exported[k]["cplm_tied_sharded"] for k in ("models", "dirs", "results"))
    shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    tensors = saved_tensors(model_dir)
    assert set(index["weight_map"]) == set(tensors)
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert_logits_are_the_models(result["logits"], model, exported["input_ids"])


def test_bf16_export_stores_bf16_and_reloads(exported: dict) -> None:
    model, model_dir, result = (exported[k]["cplm_bf16"] for k in ("models", "dirs", "results"))
    assert all(t.dtype == torch.bfloat16 for t in saved_tensors(model_dir).values())
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "bfloat16"
    # transformers 5 loads in the config's dtype; 4.x upcasts to fp32 unless asked otherwise
    assert result["dtype"] == (torch.bfloat16 if transformers.__version__ >= "5" else torch.float32)
    reference = copy.deepcopy(model)
    for param in reference.parameters():  # bf16-rounded weights; buffers (RoPE inv_freq) stay fp32
        param.data = param.data.to(torch.bfloat16).to(result["dtype"])
    assert result["logits"].dtype == torch.float32  # the mixture log-probs are fp32 whatever the weights
    assert_logits_are_the_models(result["logits"], reference, exported["input_ids"], compute_dtype=result["dtype"])


def test_constant_mixing_exports_and_reloads_with_equal_log_probs(exported: dict) -> None:
    model, model_dir, result = (exported[k]["cplm_constant"] for k in ("models", "dirs", "results"))
    assert json.loads((model_dir / "config.json").read_text())["copy_mixing"] == "constant"
    with torch.no_grad():
        expected = model(exported["input_ids"]).logits
        as_gate = copy.deepcopy(model)
        as_gate.copy_head.rule = mixing.mixing_rule("gate")  # what an export without the mixing field computed
        wrong = as_gate(exported["input_ids"]).logits
    assert_logits_are_the_models(result["logits"], model, exported["input_ids"])
    assert (wrong - expected).abs().max() > 0.05  # the random gate weight that the constant rule ignores


@pytest.mark.parametrize("name, architecture", [("llama", "LlamaForCausalLM"), ("gpt2", "GPT2LMHeadModel")])
def test_plain_backbones_export_without_custom_code(exported: dict, name: str, architecture: str) -> None:
    model, model_dir, result = (exported[k][name] for k in ("models", "dirs", "results"))
    assert result["class"] == architecture
    assert_logits_are_the_models(result["logits"], model, exported["input_ids"])
    config = json.loads((model_dir / "config.json").read_text())
    assert "auto_map" not in config and config["architectures"] == [architecture]
    assert not list(model_dir.glob("*.py"))
    assert "lm_head.weight" not in saved_tensors(model_dir)  # both are tied


def test_state_dict_errors_name_the_keys(tmp_path: Path, tokenizer_dir: Path) -> None:
    config = cplm_config(copy_qk_norm=True)
    state = tiny_cplm(config).state_dict()
    missing = {k: v for k, v in state.items() if k != "copy_head.gate.bias"}
    with pytest.raises(ValueError, match=r"missing keys: copy_head\.gate\.bias"):
        write_hf_checkpoint(tmp_path / "a", config, missing, tokenizer_dir)
    with pytest.raises(ValueError, match=r"unexpected keys: copy_head\.extra\.weight"):
        write_hf_checkpoint(tmp_path / "b", config, {**state, "copy_head.extra.weight": torch.zeros(1)}, None)
    wrong = {**state, "copy_head.q_proj.weight": torch.zeros(8, 64)}
    with pytest.raises(ValueError, match=r"copy_head\.q_proj\.weight \[8, 64\] \(config expects \[48, 64\]\)"):
        write_hf_checkpoint(tmp_path / "c", config, wrong, None)
    with pytest.raises(ValueError, match=r"unexpected keys: copy_head\.gate\.bias, copy_head\.gate\.weight"):
        write_hf_checkpoint(tmp_path / "d", llama_config_like(config), state, None)
    assert not any((tmp_path / d).exists() for d in "abcd")  # nothing half-written


def test_tied_output_weight_must_match_the_embedding(tmp_path: Path) -> None:
    config = cplm_config(tie_word_embeddings=True)
    state = dict(tiny_cplm(config).state_dict())
    write_hf_checkpoint(tmp_path / "same", config, state, None)  # identical copy of the tied weight: accepted
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(ValueError, match=r"ties embeddings but lm_head\.weight differs"):
        write_hf_checkpoint(tmp_path / "differs", config, state, None)


def test_bad_arguments_raise_clear_errors(tmp_path: Path, tokenizer_dir: Path) -> None:
    config = cplm_config()
    state = tiny_cplm(config).state_dict()
    with pytest.raises(FileNotFoundError, match="no_such_tokenizer"):
        write_hf_checkpoint(tmp_path / "a", config, state, tmp_path / "no_such_tokenizer")
    (tmp_path / "empty_tok").mkdir()
    with pytest.raises(FileNotFoundError, match="none of the tokenizer files"):
        write_hf_checkpoint(tmp_path / "b", config, state, tmp_path / "empty_tok")
    with pytest.raises(ValueError, match="vocab_size is 200"):
        write_hf_checkpoint(tmp_path / "c", cplm_config(vocab_size=200), state, tokenizer_dir)
    with pytest.raises(ValueError, match="model_type='bert'"):
        write_hf_checkpoint(tmp_path / "d", BertConfig(), state, None)
    with pytest.raises(ValueError, match="float32 or torch.bfloat16"):
        write_hf_checkpoint(tmp_path / "e", config, state, None, dtype=torch.float16)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not an empty directory"):
        write_hf_checkpoint(tmp_path / "full", config, state, None)


def test_legacy_rope_fields_mirror_rope_parameters() -> None:
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    legacy = with_legacy_rope_fields({"rope_parameters": llama3, "hidden_size": 64})
    assert legacy["rope_theta"] == 500000.0
    assert legacy["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    default = with_legacy_rope_fields({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert default["rope_theta"] == 1e4 and "rope_scaling" not in default
    assert with_legacy_rope_fields({"n_embd": 64}) == {"n_embd": 64}  # GPT-2: no RoPE


def _python_block(markdown: str) -> str:
    [block] = re.findall(r"```python\n(.*?)```", markdown, flags=re.S)
    return block


def test_a_trained_runs_export_has_a_model_card_and_its_context_length(runs: dict, hf_exports: dict) -> None:
    """tools/convert_to_hf.py writes README.md: the model, the tokens the checkpoint trained on (its record), the
    copy head and how to load it (the README's example, which tests/test_readme.py runs on this export); the
    tokenizer's model_max_length is the model's max positions (the trained tokenizer said 1e30)."""
    from transformers import PreTrainedTokenizerFast

    from cplm_megatron.checkpoint.lookup import read_record, resolve_checkpoint

    readme_example = _python_block((Path(__file__).resolve().parents[2] / "README.md").read_text())
    readme_path = re.search(r'from_pretrained\("([^"]+)"', readme_example).group(1)
    for name, architecture in (("cplm", "CPLMForCausalLM"), ("baseline", "LlamaForCausalLM")):
        out, record = hf_exports[name], read_record(resolve_checkpoint(runs[name]).path)
        card = (out / "README.md").read_text()
        assert card.startswith("---\nlibrary_name: transformers\n") and f"`{architecture}` (llama backbone)" in card
        assert f"| tokens trained | {record.consumed_tokens:,} ({record.iteration} iterations of 4 sequences x 64 " \
               f"tokens) |" in card and record.consumed_tokens == 2 * 4 * 64
        assert "| data | synthetic `copy` samples |" in card and "No evaluation was found beside the run" in card
        parameters = sum(t.numel() for t in saved_tensors(out).values())  # tied embeddings are saved once
        assert f"| parameters | {parameters:,} (" in card
        example = _python_block(card)
        if name == "cplm":
            assert "## The copy head" in card and "(2 heads x 16 dimensions)" in card
            assert example == readme_example.replace(readme_path, str(out))
        else:
            assert "copy head" not in card.lower() and "trust_remote_code" not in card
            assert example == readme_example.replace(readme_path, str(out)).replace(", trust_remote_code=True", "")
        positions = json.loads((out / "config.json").read_text())["max_position_embeddings"]
        assert PreTrainedTokenizerFast.from_pretrained(str(out)).model_max_length == positions > 0


@pytest.mark.mcore
def test_the_model_card_shows_the_runs_evaluation_of_the_exported_iteration(runs: dict, tiny_corpus,
                                                                          tmp_path: Path) -> None:
    """An eval.json in the run dir (tools/evaluate.py --all-checkpoints: iterations 1 and 2) puts the exported
    iteration's figures into the card; an eval.json of another iteration is shown with a note saying so."""
    from tests.data_fixtures import load_tool
    from tests.trained_runs import copy_run

    run = copy_run(runs["cplm"], tmp_path)
    evaluate, convert = load_tool("evaluate"), load_tool("convert_to_hf")
    common = ["--tasks", "spamlang", "--limit", "4", "--spamlang-length", "32", "--no-progress"]
    assert evaluate.main(["--checkpoint", str(run), "--all-checkpoints", "--output", str(run / "eval.json"),
                          *common]) == 0
    export = ["--checkpoint", str(run), "--tokenizer", str(tiny_corpus.tokenizer_dir), "--output"]
    assert convert.main([*export, str(tmp_path / "hf")]) == 0
    curve = json.loads((run / "eval.json").read_text())["checkpoints"]
    losses = [c["tasks"]["spamlang"]["metrics"]["spamlang_loss"] for c in curve]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert f"`tools/evaluate.py` results of iteration 2 ({run / 'eval.json'})." in card
    assert f"| spamlang / spamlang_loss | {losses[1]:.4f} |" in card
    assert evaluate.main(["--checkpoint", str(run / "checkpoints" / "iter_0000001"), "--output",
                          str(run / "eval.json"), *common]) == 0
    assert convert.main([*export, str(tmp_path / "hf1")]) == 0
    card = (tmp_path / "hf1" / "README.md").read_text()
    assert "these figures are of iteration 1, not of the exported iteration 2" in card
    assert f"| spamlang / spamlang_loss | {losses[0]:.4f} |" in card


def test_conversion_shows_its_progress_on_a_terminal_only(runs: dict, tiny_corpus, tmp_path: Path, monkeypatch,
                                                          capsys) -> None:
    """convert_to_hf on a terminal: a bar while the checkpoint's tensors are read and while they are converted and
    written (tqdm, by bytes); into a log (no terminal) no bar at all, the log lines only."""
    import fcntl
    import os
    import struct
    import termios
    import threading
    import time

    from cplm_megatron.hf.convert import convert_to_hf

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a width
    seen: list[bytes] = []

    def drain() -> None:  # read the terminal while the bars are drawn (a full pty would block the writer)
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end closed
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        convert_to_hf(runs["cplm"], tmp_path / "tty", tiny_corpus.tokenizer_dir)
        terminal.flush()
        monkeypatch.undo()
        time.sleep(0.5)  # the reader takes what is left in the terminal
    reader.join(timeout=10)
    shown = b"".join(seen).decode(errors="replace")
    assert "read checkpoint" in shown and "convert tensors" in shown and "write model.safetensors" in shown, shown
    assert "100%" in shown
    capsys.readouterr()
    convert_to_hf(runs["cplm"], tmp_path / "log", tiny_corpus.tokenizer_dir)
    err = capsys.readouterr().err
    assert "read checkpoint" not in err and "convert tensors" not in err
