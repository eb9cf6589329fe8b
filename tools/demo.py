#!/usr/bin/env python
"""The end-to-end demo behind `make demo` (CPU, about 5 minutes on 2 cores after set-up).

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
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from cplm_megatron.cli import quiet_known_warnings
from cplm_megatron.training.run_config import load_run_config

REPO = Path(__file__).resolve().parents[1]


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def run(cmd: List[str], what: str) -> None:
    """Run a step, streaming its output; stop the demo with its exit code if it fails."""
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"demo: {what} failed with exit code {proc.returncode}")


def generate_sample(hf_dir: Path, prompt: str, max_new_tokens: int = 64) -> str:
    """Sampled continuation (seeded: temperature 0.8, top-k 40) from the export; the KV cache holds the copy keys."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=True, temperature=0.8, top_k=40,
                         pad_token_id=tok.eos_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def spamlang_lines(claims: List[dict]) -> List[str]:
    """One line per SpamLang pair: the CPLM's steps to 99% beside the baseline's accuracy."""
    lines = []
    for c in claims:
        base = c["baseline_steps_to_99"]
        lines.append(
            f"SpamLang vocab {c['vocab']} (hidden {c['hidden']}, {'tied' if c['tied'] else 'untied'}): CPLM >= 99% "
            f"at step {c['cplm_steps_to_99']}, p(target) {c['cplm_final_target_prob']:.2f} after {c['iters']} steps; "
            f"baseline accuracy {c['baseline_accuracy_at_cplm_step']:.2f} at that step, "
            + (f">= 99% at step {base}" if base is not None else f"not >= 99% within {c['iters']} steps")
            + f", p(target) {c['baseline_final_target_prob']:.1e}")
    return lines


def headline(results: dict) -> List[dict]:
    """Baseline and CPLM side by side on the corpus: the last checkpoint's val loss, copy and passkey accuracy."""
    rows = []
    for name, model in (("corpus-baseline", "baseline"), ("corpus-cplm", "CPLM")):
        tasks = results["runs"][name]["evaluations"][-1]["tasks"]
        rows.append({"model": model, "val_loss": tasks["val"]["metrics"]["val_loss"],
                     "copy_accuracy": tasks["copy"]["metrics"]["copy_accuracy"],
                     "passkey_accuracy": tasks["passkey"]["metrics"]["passkey_accuracy"],
                     "passkey_token_accuracy": tasks["passkey"]["metrics"]["passkey_token_accuracy"]})
    return rows


def headline_lines(rows: List[dict], copy_head: dict) -> List[str]:
    """The summary's leading table (and the copy head's training objective, the recipe default)."""
    lines = [f"{'model':<9} {'val loss':>9} {'copy acc.':>10} {'passkey (key tokens)':>21}"]
    for r in rows:
        lines.append(f"{r['model']:<9} {r['val_loss']:>9.3f} {r['copy_accuracy']:>10.3f} "
                     f"{r['passkey_accuracy']:>10.3f} ({r['passkey_token_accuracy']:.3f})")
    lines.append(f"(CPLM objective, the recipe default: copy_head.lm_loss_weight={copy_head['lm_loss_weight']}, "
                 f"copy_head.decouple_lm={str(copy_head['decouple_lm']).lower()})")
    return lines


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
              "--vocab-sizes", "4096,16384"])
    run([py, "tools/ablate.py", "--output", str(ablation), "--quick", "--tp", str(args.tp), "--data", str(data), *sizes],
        "the ablation")

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
    results = json.loads((ablation / "results.json").read_text())
    rows = headline(results)
    copy_head = load_run_config(str(REPO / "configs" / "tiny.yaml")).copy_head
    table = headline_lines(rows, {"lm_loss_weight": copy_head.lm_loss_weight, "decouple_lm": copy_head.decouple_lm})
    summary = {
        "headline": rows,
        "report": str(ablation / "report.md"),
        "hf_model": str(hf_dir),
        "prompt": prompt,
        "sample": sample,
        "spamlang": spamlang_lines(results.get("spamlang", [])),
        "minutes": round((time.time() - start) / 60, 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("\n".join(table) + "\n")
    print(f"report:   {summary['report']}")
    print(f"HF model: {summary['hf_model']}  (AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True))")
    for line in summary["spamlang"]:
        print(line)
    print(f"done in {summary['minutes']} min; summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
