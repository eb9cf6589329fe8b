"""What `make demo` (tools/demo.py) reports: baseline and CPLM side by side on the corpus, the SpamLang lines, and a
sample generated from the Hugging Face export."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cplm_megatron.evaluation.results import read_eval_results


def generate_sample(hf_dir: Path, prompt: str, max_new_tokens: int = 64) -> str:
    """Sampled continuation (seeded: temperature 0.8, top-k 40) from the export; the KV cache holds the copy keys."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for loading a 1M-parameter model
    tok = AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True, dtype=torch.float32)
    ids = tok(prompt, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=True, temperature=0.8, top_k=40,
                         pad_token_id=tok.eos_token_id)
    return tok.decode(out[0], skip_special_tokens=True)


def spamlang_lines(claims: list[dict[str, Any]]) -> list[str]:
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


def headline(ablation: Path) -> list[dict[str, Any]]:
    """Baseline and CPLM on the corpus (the ablation's runs' eval.json): the last checkpoint's val loss, copy and
    passkey accuracy."""
    rows = []
    for name, model in (("corpus-baseline", "baseline"), ("corpus-cplm", "CPLM")):
        tasks = read_eval_results(Path(ablation) / "runs" / name / "eval.json").final["tasks"]
        rows.append({"model": model, "val_loss": tasks["val"]["metrics"]["val_loss"],
                     "copy_accuracy": tasks["copy"]["metrics"]["copy_accuracy"],
                     "passkey_accuracy": tasks["passkey"]["metrics"]["passkey_accuracy"],
                     "passkey_token_accuracy": tasks["passkey"]["metrics"]["passkey_token_accuracy"]})
    return rows


def headline_lines(rows: list[dict[str, Any]], copy_head: dict[str, Any]) -> list[str]:
    """The summary's leading table (and the copy head's training objective, the recipe default)."""
    lines = [f"{'model':<9} {'val loss':>9} {'copy acc.':>10} {'passkey (key tokens)':>21}"]
    for r in rows:
        lines.append(f"{r['model']:<9} {r['val_loss']:>9.3f} {r['copy_accuracy']:>10.3f} "
                     f"{r['passkey_accuracy']:>10.3f} ({r['passkey_token_accuracy']:.3f})")
    lines.append(f"(CPLM objective, the recipe default: copy_head.lm_loss_weight={copy_head['lm_loss_weight']}, "
                 f"copy_head.decouple_lm={str(copy_head['decouple_lm']).lower()})")
    return lines


def write_summary(out: Path, ablation: Path, hf_dir: Path, prompt: str, sample: str, minutes: float) -> list[str]:
    """OUT/summary.json of the demo; returns the lines it prints: the headline table, the report's and the export's
    paths, the SpamLang lines."""
    from cplm_megatron.run_config import load_run_config

    results = json.loads((Path(ablation) / "results.json").read_text())
    rows = headline(ablation)
    copy_head = load_run_config("tiny").copy_head
    table = headline_lines(rows, {"lm_loss_weight": copy_head.lm_loss_weight, "decouple_lm": copy_head.decouple_lm})
    summary = {"headline": rows, "report": str(Path(ablation) / "report.md"), "hf_model": str(hf_dir),
               "prompt": prompt, "sample": sample, "spamlang": spamlang_lines(results.get("spamlang", [])),
               "minutes": round(minutes, 1)}
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2))
    return [*table, "", f"report:   {summary['report']}",
            f"HF model: {summary['hf_model']}  (AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True))",
            *summary["spamlang"], f"done in {summary['minutes']} min; summary: {Path(out) / 'summary.json'}"]
