"""Fresh-process loader for exported checkpoints: run as a script by test_hf_export.py.

Usage: python hf_load_exported.py REQUEST.pt RESULT.pt, where REQUEST holds
{"dirs": [str], "input_ids": LongTensor, "text": str[, "generate": {dir: prompt LongTensor}]}; RESULT gets, per
dir, the loaded class name, its decoder's class name, dtype, logits of input_ids and the tokenizer's ids of text,
and for the dirs in "generate" greedy generation from the prompt with the KV cache and without (sequences and
per-step log-probs of each).
"""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def greedy(model, prompt: torch.Tensor, use_cache: bool) -> dict:
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                         use_cache=use_cache, pad_token_id=model.generation_config.pad_token_id,
                         return_dict_in_generate=True, output_logits=True)
    return {"sequences": out.sequences, "logits": torch.stack(out.logits, dim=1)}


def load_and_run(model_dir: str, input_ids: torch.Tensor, text: str, prompt: torch.Tensor | None = None) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    with torch.no_grad():
        logits = model(input_ids).logits
    result = {
        "class": type(model).__name__,
        "decoder": type(model.base_model).__name__,
        "dtype": model.dtype,
        "logits": logits,
        "token_ids": tokenizer(text).input_ids,
    }
    if prompt is not None:
        result["generated"] = {name: greedy(model, prompt, cache) for name, cache in (("cached", True),
                                                                                      ("uncached", False))}
    return result


def main(request_path: str, result_path: str) -> None:
    request = torch.load(request_path)
    prompts = request.get("generate", {})
    results = {d: load_and_run(d, request["input_ids"], request["text"], prompts.get(d)) for d in request["dirs"]}
    torch.save(results, result_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
