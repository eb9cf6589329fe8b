"""Fresh-process loader for exported checkpoints: run as a script by test_hf_export.py.

Usage: python hf_load_exported.py REQUEST.pt RESULT.pt, where REQUEST holds
{"dirs": [str], "input_ids": LongTensor, "text": str}; RESULT gets, per dir, the loaded class name,
dtype, logits of input_ids and the tokenizer's ids of text.
"""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def load_and_run(model_dir: str, input_ids: torch.Tensor, text: str) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    with torch.no_grad():
        logits = model(input_ids).logits
    return {
        "class": type(model).__name__,
        "dtype": model.dtype,
        "logits": logits,
        "token_ids": tokenizer(text).input_ids,
    }


def main(request_path: str, result_path: str) -> None:
    request = torch.load(request_path)
    results = {d: load_and_run(d, request["input_ids"], request["text"]) for d in request["dirs"]}
    torch.save(results, result_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
