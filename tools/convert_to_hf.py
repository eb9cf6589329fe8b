#!/usr/bin/env python
"""Export a Megatron torch_dist training checkpoint (saved at any TP/PP) as a Hugging Face model directory.

    python tools/convert_to_hf.py --checkpoint runs/tiny --output hf/tiny [--tokenizer DIR] [--dtype bf16|fp32]

--checkpoint is a run directory, its checkpoints/ root (follows `latest`) or one iter_* directory.
Llama-family checkpoints with the Copy-Paste head become CPLMForCausalLM (model code shipped in the
directory, load with trust_remote_code=True), without it LlamaForCausalLM; gpt2-family ones become
GPT2LMHeadModel. The tokenizer defaults to the checkpoint root's tokenizer/ directory, the one of the
checkpoint the run started from (checkpoint.load), or the one its training data was tokenized with.
Runs in one process on CPU; optimizer state in the checkpoint is not read.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from cplm_megatron.entry_points import exit_2_on, quiet_known_warnings
from cplm_megatron.evaluation.results import EvalResultsError, read_eval_results
from cplm_megatron.hf.convert import DTYPES, convert_to_hf


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="run dir, checkpoints/ root or iter_* dir")
    parser.add_argument("--output", required=True, help="HF directory to write (new or empty)")
    parser.add_argument("--tokenizer", help="HF tokenizer directory (default: found from the checkpoint)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="weight dtype (default: bf16 for bf16 "
                        "checkpoints, else fp32)")
    return parser.parse_args(argv)


def refuse_hf_directory(path: Path) -> None:
    """A Hugging Face model directory given as --checkpoint: say what it is and which tool reads it."""
    if (path / "config.json").is_file() and not (path / "checkpoints").exists() and path.name != "checkpoints" \
            and not (path / "cplm_state.json").is_file():
        raise ValueError(f"{path} is a Hugging Face model directory (config.json + weights), already converted: load it "
                         f"with transformers or evaluate it with tools/evaluate.py --hf {path}; to train from it, "
                         f"tools/convert_from_hf.py --hf {path} --output DIR")


def read_evaluation(path: Path) -> list[dict] | None:
    """The run's eval.json for the model card; an unreadable one is left out of the card, said in one line."""
    try:
        return read_eval_results(path).checkpoints
    except EvalResultsError as err:
        logging.getLogger("cplm_megatron").warning("model card without evaluation: %s", err)
        return None


@exit_2_on(ValueError, FileNotFoundError, FileExistsError)
def main(argv: list[str] | None = None) -> int:
    """Convert; errors about the inputs print one line and exit with 2."""
    quiet_known_warnings()
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[convert_to_hf] %(message)s")
    logging.getLogger("cplm_megatron").setLevel(logging.INFO)
    refuse_hf_directory(Path(args.checkpoint))
    out = convert_to_hf(args.checkpoint, args.output, args.tokenizer, args.dtype, read_evaluation=read_evaluation)
    print(f"[convert_to_hf] done: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
