"""Conversion inputs given to the wrong tool say what they are and which tool reads them; an export's tokenizer
names a standard tokenizer class, so loading it with no terminal attached asks nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_fixtures import load_tool


def test_an_hf_directory_given_to_convert_to_hf_is_named_as_one(tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert load_tool("convert_to_hf").main(["--checkpoint", str(hf), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {hf} is a Hugging Face model directory (config.json + weights), already converted")
    assert f"tools/evaluate.py --hf {hf}" in err and f"tools/convert_from_hf.py --hf {hf}" in err
    assert not (tmp_path / "out").exists()


def test_a_megatron_run_given_to_convert_from_hf_is_named_as_one(tmp_path):
    from tests import harness

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    proc = harness.run_tool_warm("convert_from_hf", "--hf", str(run), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    [err] = [line for line in proc.stderr.splitlines() if not line.startswith("[compat] ")]
    assert err == (f"error: {run} is a Megatron training checkpoint, not a Hugging Face directory: export it with "
                   f"tools/convert_to_hf.py --checkpoint {run} --output DIR"), err


def _tokenizer_dir(path: Path, config: dict) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x + 1\n"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("config", [{"eos_token": "<|endoftext|>"},  # no class: AutoTokenizer would read config.json
                                    {"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}])
def test_the_exported_tokenizer_names_a_standard_class_and_loads_without_a_prompt(tmp_path, config):
    from cplm_megatron.hf.export import STANDARD_TOKENIZER_CLASS, _copy_tokenizer_files

    src = _tokenizer_dir(tmp_path / "tok", config)
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "cplm", "auto_map": {  # as a CPLM export's
        "AutoConfig": "configuration_cplm.CPLMConfig", "AutoModelForCausalLM": "modeling_cplm.CPLMForCausalLM"}}))
    _copy_tokenizer_files(src, out)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] in (STANDARD_TOKENIZER_CLASS, config.get("tokenizer_class"))
    assert saved["eos_token"] == "<|endoftext|>"
    code = ("from transformers import PreTrainedTokenizerFast\n"
            f"t = PreTrainedTokenizerFast.from_pretrained({str(out)!r})\n"
            "print(t.decode(t('def f(x):').input_ids))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "def f(x):", proc.stderr[-2000:]
    assert "[y/N]" not in proc.stderr
