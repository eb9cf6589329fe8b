"""lm-eval (hf backend, trust_remote_code) on an exported tiny CPLM scores with the mixture log-probs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_testing import PAD_ID, cplm_config, tiny_cplm
from transformers import AutoTokenizer

from cplm_megatron.evaluation.tasks.lmeval import offline_env
from cplm_megatron.evaluation.tasks.lmeval_local import template_path, write_local_task
from cplm_megatron.hf.export import write_hf_checkpoint

MC_DOCS = [
    {"context": "copy paste copy paste copy", "choices": ["paste", "fox", "lazy dog"], "label": 0},
    {"context": "the quick brown fox jumps over the lazy dog 3\nthe quick brown", "choices": ["fox", "dog"],
     "label": 0},
    {"context": "jumps over the", "choices": ["lazy dog", "quick fox"], "label": 0},
]
PPL_DOCS = [{"text": "the quick brown fox jumps over the lazy dog 12"}, {"text": "copy paste copy paste 7"}]
GEN_DOCS = [{"prompt": "copy paste copy paste copy", "target": " paste"}]
# lm-eval sums fp32 log-probs (|log p| <~ 7 each, <= ~20 tokens) in its own batching/padding: each per-token
# value moves by ~1e-6 with the batch shape (see STEP_ATOL in test_cplm_generation.py), ~20 of them -> 1e-4
LL_ATOL = 1e-4


def continuation_log_likelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log p(continuation | context) tokenised the way lm-eval's hf backend does (_encode_pair)."""
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    context_ids = tokenizer(context, add_special_tokens=False).input_ids
    continuation_ids = whole[len(context_ids):]
    inputs = torch.tensor((context_ids + continuation_ids)[:-1])[None]
    with torch.no_grad():
        log_probs = model(inputs).logits[0, -len(continuation_ids):]
    return float(log_probs.gather(-1, torch.tensor(continuation_ids)[:, None]).sum())


def read_samples(out_dir: Path, task: str) -> list[dict]:
    (path,) = out_dir.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_lm_eval_scores_exported_cplm_with_mixture_log_probs(tmp_path: Path, tokenizer_dir: Path) -> None:
    model = tiny_cplm(cplm_config(copy_qk_norm=True), seed=11, gate_bias=1.0)
    model_dir = write_hf_checkpoint(tmp_path / "model", model.config, model.state_dict(), tokenizer_dir)
    tasks = tmp_path / "tasks"
    write_local_task(tasks, "cplm_tiny_mc", "multiple_choice", MC_DOCS)
    write_local_task(tasks, "cplm_tiny_ppl", "loglikelihood_rolling", PPL_DOCS)
    write_local_task(tasks, "cplm_tiny_gen", "generate_until", GEN_DOCS)
    out_dir = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf",
         "--model_args", f"pretrained={model_dir},trust_remote_code=True",
         "--include_path", str(tasks), "--tasks", "cplm_tiny_mc,cplm_tiny_ppl,cplm_tiny_gen",
         "--device", "cpu", "--batch_size", "2", "--output_path", str(out_dir), "--log_samples"],
        env=offline_env(tmp_path / "hf_home"), capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    for sample in read_samples(out_dir, "cplm_tiny_mc"):
        doc = sample["doc"]
        got = [float(resp[0][0]) for resp in sample["resps"]]
        expected = [continuation_log_likelihood(model, tokenizer, doc["context"], " " + c) for c in doc["choices"]]
        assert got == pytest.approx(expected, abs=LL_ATOL)

    for sample in read_samples(out_dir, "cplm_tiny_ppl"):
        # one rolling window: the document after the prefix (bos/eos) token
        got = float(sample["resps"][0][0])
        expected = continuation_log_likelihood(model, tokenizer, tokenizer.bos_token, sample["doc"]["text"])
        assert got == pytest.approx(expected, abs=LL_ATOL)

    (sample,) = read_samples(out_dir, "cplm_tiny_gen")
    prompt = tokenizer(sample["doc"]["prompt"], return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=16, do_sample=False, pad_token_id=PAD_ID)
    text = tokenizer.decode(generated[0, prompt.input_ids.shape[1]:], skip_special_tokens=True)
    assert sample["resps"][0][0] == text.split("\n")[0]


def test_local_task_writer_validates_docs(tmp_path: Path) -> None:
    yaml_path = write_local_task(tmp_path, "tiny", "multiple_choice", MC_DOCS[:1])
    assert str(template_path("multiple_choice")) in yaml_path.read_text()
    assert json.loads((tmp_path / "tiny.jsonl").read_text()) == MC_DOCS[0]
    with pytest.raises(ValueError, match=r"document 0 lacks fields \['label'\]"):
        write_local_task(tmp_path, "bad", "multiple_choice", [{"context": "a", "choices": ["b"]}])
    with pytest.raises(ValueError, match="unknown local task kind 'essay'"):
        write_local_task(tmp_path, "bad", "essay", PPL_DOCS)
    with pytest.raises(ValueError, match="task name"):
        write_local_task(tmp_path, "bad name!", "loglikelihood_rolling", PPL_DOCS)
