"""convert_from_hf: HF Llama-family checkpoints -> Megatron checkpoint roots the trainer continues from.

- A random GQA LlamaForCausalLM -> (CLI, --no-copy-head) -> Megatron -> (CLI) -> HF: identical weights,
  identical logits. Loaded at TP=2 in 2 processes the way pretrain_cplm.py starts from
  `checkpoint.load`, Megatron's logits equal HF's (the zero-filled padded vocab rows give logits of
  exactly 0) and its loss equals the HF cross entropy over the padded vocabulary.
- Untied embeddings + head_dim != hidden/heads, with a freshly initialized copy head; an HF CPLM keeps
  its trained copy head through the round trip.
- Clear errors: unsupported architectures, preset mismatches, missing files (fast; the conversions
  and the TP=2 processes are shared by the tests marked slow).
"""

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import megatron_workers as mw
import pytest
import torch
import torch.nn.functional as F
from hf_testing import (
    BACKBONE,
    COPY_HEAD,
    VOCAB_SIZE,
    assert_logits_are_the_models,
    cplm_config,
    randomize_norms,
    tiny_cplm,
)
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
)

from cplm_megatron.evaluation.tasks.lmeval import offline_env
from cplm_megatron.hf.config_mapping import (
    ConversionError,
    check_preset_matches,
    copy_head_config_from_hf,
    model_config_from_hf,
)
from cplm_megatron.hf.convert import continue_overrides, convert_from_hf, convert_to_hf
from cplm_megatron.hf.megatron_checkpoint import MegatronCheckpoint
from cplm_megatron.hf.tokenizer_lookup import find_tokenizer
from cplm_megatron.model.config import load_preset
from tests.dist_utils import run_distributed

pytestmark = pytest.mark.mcore  # the outcome depends on megatron-core (both CI legs)

REPO = Path(__file__).resolve().parents[2]
PADDED_VOCAB = 384  # VOCAB_SIZE=300 rounded up to the pad multiple 128
# two independent fp32 implementations (Megatron at TP=2 vs HF) of a hidden-64, 2-layer, 300-token model:
# other summation orders in every matmul and softmax plus separately computed RoPE tables give ~1e-5
# relative on |logits| <~ 10 -> 1e-4
ATOL = 1e-4


def save_hf(model: torch.nn.Module, out: Path, tokenizer_dir: Path | None) -> Path:
    model.save_pretrained(out)
    if tokenizer_dir is not None:
        for item in tokenizer_dir.iterdir():
            shutil.copyfile(item, out / item.name)
    return out


def logits_of(model_dir: Path, input_ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    with torch.no_grad():
        return model(input_ids).logits


def start_tool(tool: str, *args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, f"tools/{tool}.py", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run_tool(tool: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"tools/{tool}.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> dict:
    """Three HF sources converted to Megatron: one through the CLI, two through the library in one process."""
    root = tmp_path_factory.mktemp("from_hf")
    torch.manual_seed(0)
    gqa = LlamaForCausalLM(LlamaConfig(**BACKBONE, tie_word_embeddings=True, rope_theta=50000.0,
                                       rms_norm_eps=1e-6)).eval()
    untied = LlamaForCausalLM(LlamaConfig(**{**BACKBONE, "num_key_value_heads": 1}, head_dim=24,
                                          tie_word_embeddings=False)).eval()
    cplm = tiny_cplm(cplm_config(copy_qk_norm=True), seed=3)
    for seed, model in enumerate((gqa, untied, cplm)):
        randomize_norms(model, seed)
    sources = {name: save_hf(model, root / "hf" / name, tokenizer_dir if name == "gqa" else None)
               for name, model in (("gqa", gqa), ("untied", untied), ("cplm", cplm))}

    env = offline_env(root / "hf_home")
    cli = start_tool("convert_from_hf", "--hf", str(sources["gqa"]), "--output", str(root / "gqa"),
                     "--no-copy-head", env=env)
    jobs = [{"hf_dir": str(sources["untied"]), "output": str(root / "untied"), "copy_heads": 2, "copy_head_dim": 8},
            {"hf_dir": str(sources["cplm"]), "output": str(root / "cplm")}]
    try:
        run_distributed(mw.convert_from_hf_jobs, 1, jobs)  # meanwhile the CLI converts the first source
        stdout, stderr = cli.communicate(timeout=600)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, stderr[-4000:]
    return {"root": root, "sources": sources, "models": {"gqa": gqa, "untied": untied, "cplm": cplm},
            "cli_log": stderr + stdout, "env": env}


def saved_config(root: Path) -> dict:
    from megatron.core.dist_checkpointing import load_common_state_dict

    return load_common_state_dict(str(root / "iter_0000000"))["config"]


@pytest.mark.slow
def test_checkpoint_root_layout_and_config(converted: dict) -> None:
    root = converted["root"] / "gqa"
    assert (root / "latest").read_text().strip() == "iter_0000000"
    record = json.loads((root / "iter_0000000" / "cplm_state.json").read_text())
    assert record["has_optimizer"] is False and record["iteration"] == 0
    assert (root / "tokenizer" / "tokenizer.json").is_file()
    config = saved_config(root)
    model = config["model"]
    assert (model["num_layers"], model["hidden_size"], model["num_attention_heads"], model["num_query_groups"],
            model["ffn_hidden_size"], model["vocab_size"]) == (2, 64, 4, 2, 128, VOCAB_SIZE)
    assert (model["rope_theta"], model["norm_eps"], model["tie_embeddings"]) == (50000.0, 1e-6, True)
    assert config["copy_head"]["enabled"] is False
    log = converted["cli_log"]
    assert "continue training with --set" in log and "checkpoint.load_optimizer=false" in log


@pytest.mark.slow
def test_cli_round_trip_gives_identical_weights_and_logits(converted: dict) -> None:
    out = converted["root"] / "gqa_back"
    cli = run_tool("convert_to_hf", "--checkpoint", str(converted["root"] / "gqa"), "--output", str(out),
                   env=converted["env"])
    assert cli.returncode == 0, cli.stderr[-4000:]
    assert "[convert_to_hf] read 8 tensors" in cli.stderr  # progress output
    original = converted["models"]["gqa"]
    back = load_file(str(out / "model.safetensors"))
    assert set(back) == set(original.state_dict()) - {"lm_head.weight"}  # tied: stored once
    for name, tensor in back.items():
        # bitwise: HF -> Megatron checkpoint -> HF only copies (and reshapes) fp32 tensors
        assert torch.equal(tensor, original.state_dict()[name]), name
    input_ids = torch.randint(0, VOCAB_SIZE, (2, 24), generator=torch.Generator().manual_seed(1))
    assert_logits_are_the_models(logits_of(out, input_ids), original, input_ids)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["rope_theta"] == 50000.0
    assert config["rms_norm_eps"] == 1e-6 and config["num_key_value_heads"] == 2
    assert (out / "tokenizer.json").read_bytes() == (converted["sources"]["gqa"] / "tokenizer.json").read_bytes()


@pytest.mark.slow
def test_megatron_at_tp2_matches_hf(converted: dict) -> None:
    root = converted["root"] / "gqa"
    overrides = [item for item in continue_overrides(root, saved_config(root)) if not item.startswith("checkpoint.")]
    batches = [torch.randint(0, VOCAB_SIZE, (2, mw.SEQ_LEN), generator=torch.Generator().manual_seed(s))
               for s in (2, 3)]
    results = run_distributed(mw.load_and_score, 2, [*overrides, "parallel.tp=2"], str(root), batches,
                              ["logits", "loss"])
    [outputs] = [r for r in results if r is not None]
    original = converted["models"]["gqa"]
    worst_logit = worst_loss = 0.0
    for ids, logits, loss in zip(batches, outputs["logits"], outputs["loss"]):
        with torch.no_grad():
            expected = original(ids).logits
        assert logits.shape == (*ids.shape, PADDED_VOCAB)
        assert torch.equal(logits[..., VOCAB_SIZE:], torch.zeros_like(logits[..., VOCAB_SIZE:]))  # zero-filled rows
        worst_logit = max(worst_logit, (logits[..., :VOCAB_SIZE] - expected).abs().max().item())
        # Megatron normalizes over the padded vocabulary: the HF logits plus 84 zero logits
        padded = F.pad(expected, (0, PADDED_VOCAB - VOCAB_SIZE))
        hf_loss = F.cross_entropy(padded[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        worst_loss = max(worst_loss, (loss[:, :-1] - hf_loss).abs().max().item())
    print(f"TP=2 Megatron vs HF: max |logit diff| {worst_logit:.3g}, max |per-token loss diff| {worst_loss:.3g}")
    assert worst_logit <= ATOL and worst_loss <= ATOL


@pytest.mark.slow
def test_untied_import_with_fresh_copy_head(converted: dict, tmp_path: Path, tokenizer_dir: Path) -> None:
    config = saved_config(converted["root"] / "untied")
    assert config["model"]["kv_channels"] == 24 and config["model"]["tie_embeddings"] is False
    head = config["copy_head"]
    assert (head["enabled"], head["heads"], head["head_dim"]) == (True, 2, 8)
    out = convert_to_hf(converted["root"] / "untied", tmp_path / "hf", tokenizer=tokenizer_dir)
    back = load_file(str(out / "model.safetensors"))
    original = converted["models"]["untied"].state_dict()
    assert set(back) - set(original) == {"copy_head.q_proj.weight", "copy_head.k_proj.weight",
                                         "copy_head.gate.weight", "copy_head.gate.bias"}
    for name, tensor in original.items():
        # bitwise: copied, as above
        assert torch.equal(back[name], tensor), name
    # Megatron's fresh copy head: gate bias at copy_head.gate_bias_init, N(0, init_method_std) projections
    assert back["copy_head.gate.bias"].item() == -2.0
    assert back["copy_head.q_proj.weight"].shape == (16, 64)
    assert abs(back["copy_head.k_proj.weight"].std().item() - 0.02) < 0.004


@pytest.mark.slow
def test_cplm_import_keeps_the_trained_copy_head(converted: dict, tmp_path: Path, tokenizer_dir: Path) -> None:
    config = saved_config(converted["root"] / "cplm")
    assert (config["copy_head"]["heads"], config["copy_head"]["head_dim"], config["copy_head"]["qk_norm"]) == (
        COPY_HEAD["copy_heads"], COPY_HEAD["copy_head_dim"], True)
    out = convert_to_hf(converted["root"] / "cplm", tmp_path / "hf", tokenizer=tokenizer_dir)
    original = converted["models"]["cplm"]
    back = load_file(str(out / "model.safetensors"))
    assert set(back) == set(original.state_dict())
    for name, tensor in back.items():
        # bitwise: copied, as above
        assert torch.equal(tensor, original.state_dict()[name]), name
    input_ids = torch.tensor([[5, 17, 42, 5, 17, 99, 5, 17, 42, 200]])
    assert_logits_are_the_models(logits_of(out, input_ids), original, input_ids)


@pytest.mark.slow
def test_tokenizer_of_a_run_started_from_a_converted_checkpoint(converted: dict, tmp_path: Path) -> None:
    """A run with checkpoint.load=<converted root> exports with the tokenizer convert_from_hf copied there."""
    root = converted["root"] / "gqa"
    run_checkpoint = MegatronCheckpoint(tmp_path / "run" / "checkpoints" / "iter_0000100", load_preset("tiny"),
                                        None, {"checkpoint": {"load": str(root)}, "data": {"streams": []}}, {})
    assert find_tokenizer(run_checkpoint) == root / "tokenizer"


# ----------------------------------------------------------------------------- errors (no Megatron model)
def test_unsupported_architectures(tmp_path: Path) -> None:
    BertConfig().save_pretrained(tmp_path / "bert")
    with pytest.raises(ConversionError, match=r"unsupported architecture.*model_type='bert'"):
        convert_from_hf(tmp_path / "bert", tmp_path / "out")
    MistralConfig(**BACKBONE, sliding_window=64).save_pretrained(tmp_path / "mistral")
    with pytest.raises(ConversionError, match="sliding_window=64"):
        convert_from_hf(tmp_path / "mistral", tmp_path / "out")
    LlamaConfig(**BACKBONE, attention_bias=True).save_pretrained(tmp_path / "biased")
    with pytest.raises(ConversionError, match="attention_bias=True"):
        convert_from_hf(tmp_path / "biased", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_preset_mismatch_names_the_field_and_both_values(tmp_path: Path) -> None:
    LlamaConfig(**BACKBONE).save_pretrained(tmp_path / "hf")
    with pytest.raises(ConversionError, match=r"--preset tiny does not match.*hidden_size: preset tiny has 128, "
                                              r".*config.json has 64"):
        convert_from_hf(tmp_path / "hf", tmp_path / "out", preset="tiny")
    with pytest.raises(ConversionError, match="unknown model.preset 'no-such-preset'"):
        convert_from_hf(tmp_path / "hf", tmp_path / "out", preset="no-such-preset")


def test_smollm2_shaped_config_matches_its_preset() -> None:
    smollm2 = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                          initializer_range=0.041666666666666664)
    derived = model_config_from_hf(smollm2, "smollm2/config.json")
    with pytest.raises(ConversionError, match="rope_theta: preset smollm2-135m has 10000.0, .* has 100000.0"):
        check_preset_matches("smollm2-135m", derived, "smollm2/config.json")
    derived.rope_theta = 10000.0
    assert check_preset_matches("smollm2-135m", derived, "smollm2/config.json").preset == "smollm2-135m"


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="config.json not found"):
        convert_from_hf(tmp_path / "nothing", tmp_path / "out")
    LlamaConfig(**BACKBONE).save_pretrained(tmp_path / "no_weights")
    with pytest.raises(ConversionError, match="no weights in .*model.safetensors"):
        convert_from_hf(tmp_path / "no_weights", tmp_path / "out")


def test_cli_errors_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # restored after the test (the tool hides GPUs)
    spec = importlib.util.spec_from_file_location("convert_from_hf_tool", REPO / "tools" / "convert_from_hf.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    BertConfig().save_pretrained(tmp_path / "bert")
    assert tool.main(["--hf", str(tmp_path / "bert"), "--output", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[compat] ")]
    assert err[0].startswith("error: unsupported architecture"), err
    LlamaForCausalLM(LlamaConfig(**BACKBONE)).save_pretrained(tmp_path / "truncated")  # cut short by a download
    weights = tmp_path / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()  # save_pretrained's progress bar
    assert tool.main(["--hf", str(tmp_path / "truncated"), "--output", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("[convert_from_hf] ", "[compat] "))]
    assert len(err) == 1 and err[0].startswith(f"error: {weights} is not a complete safetensors file"), err
    assert "download or copy it again" in err[0] and not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        tool.main(["--hf", "x", "--output", "y", "--no-copy-head", "--copy-heads", "2"])


def test_sentinel_copy_head_maps_both_ways_with_one_sentinel_per_copy_head() -> None:
    """HF CPLM (copy_mixing: sentinel, gate [H_c, d]) -> Megatron tensors -> HF: the same tensors, and the
    gate's shape follows the rule (a gate-shaped [1, d] tensor is refused by name)."""
    from cplm_megatron.hf.weight_mapping import hf_to_megatron, megatron_to_hf

    hf = tiny_cplm(cplm_config(copy_mixing="sentinel"), seed=2)
    model = model_config_from_hf(hf.config, "sentinel")
    copy = copy_head_config_from_hf(hf.config, enabled=True)
    assert copy.mixing == "sentinel"
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    tensors = hf_to_megatron(state, model, copy)
    assert tensors["copy_head.gate.weight"].shape == (3, 64) and tensors["copy_head.gate.bias"].shape == (3,)
    back = megatron_to_hf(tensors, model, copy)
    for key, value in back.items():
        assert torch.equal(value, state[key]), key  # bitwise: the mapping only reshapes and copies
    as_gate = dataclasses.replace(copy, mixing="gate")
    with pytest.raises(ConversionError, match="copy_head.gate.weight"):
        megatron_to_hf(tensors, model, as_gate)
