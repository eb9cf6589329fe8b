#!/usr/bin/env python
"""The end-to-end demo behind `make demo` (CPU, about 12 minutes on 2 cores after set-up; 20 on one).

1. the embedded corpus (built by `make data`);
2. a tiny CPLM and its baseline trained with TP=2 on 2 processes, identical settings, on the corpus
   and on SpamLang (tools/ablate.py --quick --tp 2), evaluated side by side (val, copy, passkey,
   spamlang, gradient) into a markdown report with plots;
3. the CPLM exported to Hugging Face format (tools/convert_to_hf.py);
4. a sample generated from the export with `transformers` (trust_remote_code);
5. a summary led by the headline table (val loss, copy accuracy, passkey retrieval of baseline and CPLM),
   then the SpamLang lines and the paths of the report and the HF model.

  .venv/bin/python tools/demo.py [--data data/stdlib] [--output runs/demo]
Finished steps are reused when the command is repeated.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from cplm_megatron.entry_points import quiet_known_warnings
from cplm_megatron.experiments.demo import generate_sample, write_summary

REPO = Path(__file__).resolve().parents[1]


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(cmd: List[str], what: str) -> None:
    """Run a step, streaming its output; stop the demo with its exit code if it fails."""
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"demo: {what} failed with exit code {proc.returncode}")


def main(argv: Optional[List[str]] = None) -> int:
    quiet_known_warnings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/stdlib", help="the embedded corpus (make data)")
    p.add_argument("--output", default="runs/demo")
    p.add_argument("--tp", type=int, default=2, choices=(1, 2), help="tensor parallel size of the training runs")
    p.add_argument("--corpus-iters", type=int, default=200, help="training steps of the corpus pair")
    p.add_argument("--smoke", action="store_true", help="a few steps per run: checks every step of the demo (CI)")
    args = p.parse_args(argv)
    out = (REPO / args.output).resolve()
    data = (REPO / args.data).resolve()
    if not (data / "train" / "manifest.json").is_file():
        raise SystemExit(f"demo: no corpus at {data}; run `make data` first")
    start = time.time()
    py = sys.executable

    banner(f"1-2. baseline vs CPLM with TP={args.tp}: corpus + SpamLang, evaluation, report")
    ablation = out / "ablation"
    sizes = (["--corpus-iters", "6", "--corpus-interval", "3", "--spamlang-iters", "4", "--spamlang-interval", "2",
              "--vocab-sizes", "4096", "--eval-sequences", "4"] if args.smoke else
             ["--corpus-iters", str(args.corpus_iters), "--corpus-interval", str(args.corpus_iters // 2),
              "--corpus-val-interval", str(max(1, args.corpus_iters // 10)), "--vocab-sizes", "4096,16384"])
    every = 2 if args.smoke else 20
    print(f"each run's log: {ablation}/runs/<run>/train.log and eval.log; progress every {every} s", flush=True)
    run([py, "tools/ablate.py", "--output", str(ablation), "--quick", "--tp", str(args.tp), "--data", str(data), *sizes,
         "--progress-every", str(every)], "the ablation")

    banner("3. export the CPLM to Hugging Face format")
    hf_dir = out / "hf"
    cplm_run = ablation / "runs" / "corpus-cplm"
    if not (hf_dir / "config.json").is_file():
        run([py, "tools/convert_to_hf.py", "--checkpoint", str(cplm_run), "--output", str(hf_dir),
             "--tokenizer", str(data / "tokenizer")], "the export")

    banner("4. generate from the export (transformers, trust_remote_code=True)")
    prompt = "def __init__(self, "
    sample = generate_sample(hf_dir, prompt)
    print(sample)

    banner("5. summary")
    print("\n".join(write_summary(out, ablation, hf_dir, prompt, sample, (time.time() - start) / 60)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
