"""The peer beside our training runs: Hugging Face transformers' LlamaForCausalLM at the same shapes as a slot of
the GPU check (benchmarks/gpu/runs.py: the model preset's sizes, sequence length, micro-batch and micro-batches per
step), trained as a user of that library trains it: fp32 weights with bf16 autocast, fused AdamW (CUDA), SDPA
attention, gradient clipping, random tokens; eager, and under torch.compile where asked. Per variant: the mean
step time after the warm-up steps, tokens/s, peak memory -> WORK_DIR/peer_<group>.json (rewritten after every
variant).

    python -m benchmarks.gpu.hf_peer WORK_DIR GROUP [--dry-run]

On a GPU the micro-batch is the largest that divides the slot's sequences per step and whose estimate (the planner's
for our model with fp32 weights and Megatron's logits) times the peer's margin measured at that shape
(model/sizing/planner.py peer_margin) fits the device's memory less a reserve: the 1.7B/4k slot trains micro-batch 4
on an H200 (85.9 GiB measured there) and 2 on an H100. The dry run trains the tiny preset on CPU and compiles with
the `aot_eager` backend (it checks the script and the compile path's tracing, not a measurement; inductor's CPU
code generation would take minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.gpu.runs import SHAPES, Shape

# group: (slot, compiled) variants, the most wanted first
VARIANTS: Dict[str, List[Tuple[str, bool]]] = {
    "check": [("small", False), ("small", True)],
    "perf": [("large_4k", False)],
}
WARMUP_STEPS = 3  # left out of the mean (the dry run: 1), as the summary leaves out our runs' first steps
PRESET_DIR = Path("configs/models")


def llama_config(preset: str, seq_len: int):
    """A LlamaConfig with the preset's sizes (configs/models/PRESET.yaml of the scratch tree)."""
    import yaml
    from transformers import LlamaConfig

    m = yaml.safe_load((PRESET_DIR / f"{preset}.yaml").read_text())
    return LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"],
                       intermediate_size=m["ffn_hidden_size"], num_hidden_layers=m["num_layers"],
                       num_attention_heads=m["num_attention_heads"],
                       num_key_value_heads=m.get("num_query_groups") or m["num_attention_heads"],
                       max_position_embeddings=max(seq_len, m["max_position_embeddings"]),
                       rms_norm_eps=m.get("norm_eps", 1e-5), rope_theta=m.get("rope_theta", 10000.0),
                       tie_word_embeddings=m.get("tie_embeddings", True), attn_implementation="sdpa")


def peer_micro_batch(shape: Shape, device_gib: float):
    """The planner's choice of the peer's micro-batch on a device of `device_gib` (model/sizing/planner.py)."""
    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.sizing.accounting import memory_estimate
    from cplm_megatron.model.sizing.planner import choose_micro_batch, peer_margin

    model = replace(load_preset(shape.preset), max_position_embeddings=max(shape.seq_len, 2048))

    def estimate(micro: int) -> float:
        return memory_estimate(model, None, tp=1, pp=1, dp=1, seq_len=shape.seq_len, micro_batch=micro,
                               param_bytes=4, lm_head_loss="megatron")["total_gib"]

    return choose_micro_batch(estimate, shape.global_batch, shape.micro_batch, device_gib,
                              margin=peer_margin(shape.preset, shape.seq_len))


def train_variant(shape: Shape, compiled: bool, device: str, dry_run: bool) -> dict:
    """One variant's figures."""
    import torch
    from transformers import LlamaForCausalLM

    from benchmarks.common import sync

    choice = None
    if device == "cuda":
        choice = peer_micro_batch(shape, torch.cuda.get_device_properties(0).total_memory / 2**30)
        print(f"[peer] {choice.line()}", flush=True)
        shape = replace(shape, micro_batch=choice.micro_batch)
    torch.manual_seed(0)
    start = time.time()
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(shape.preset, shape.seq_len))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                                  fused=device == "cuda")
    forward = torch.compile(model, backend="aot_eager" if dry_run else "inductor") if compiled else model
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    gen = torch.Generator(device=device).manual_seed(1)
    vocab, times = model.config.vocab_size, []
    for _ in range(shape.iters):
        sync()
        t0 = time.perf_counter()
        for _ in range(shape.micro_batches_per_step):
            ids = torch.randint(0, vocab, (shape.micro_batch, shape.seq_len), device=device, generator=gen)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = forward(input_ids=ids, labels=ids).loss / shape.micro_batches_per_step
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    warmup = 1 if dry_run else WARMUP_STEPS
    step_time = sum(times[warmup:]) / len(times[warmup:])
    return {"preset": shape.preset, "seq_len": shape.seq_len, "micro_batch": shape.micro_batch,
            "global_batch": shape.global_batch, "micro_batch_choice": choice.line() if choice else None,
            "compiled": compiled,
            "compile_backend": ("aot_eager" if dry_run else "inductor") if compiled else None,
            "params": sum(p.numel() for p in model.parameters()), "iterations": shape.iters,
            "warmup_steps_excluded": warmup, "step_time": step_time,
            "tokens_per_sec": shape.global_batch * shape.seq_len / step_time,
            "first_step_s": times[0], "final_loss": float(loss) * shape.micro_batches_per_step,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
            "wall_s": time.time() - start}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path)
    p.add_argument("group", choices=sorted(VARIANTS))
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    out = {"peer": "transformers LlamaForCausalLM: fp32 weights, bf16 autocast, fused AdamW (CUDA), SDPA",
           "torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "variants": {}}
    path, failed = args.work / f"peer_{args.group}.json", 0
    for slot, compiled in VARIANTS[args.group]:
        name = f"{slot}_{'compiled' if compiled else 'eager'}"
        try:
            row = train_variant(SHAPES[slot][1 if args.dry_run else 0], compiled, device, args.dry_run)
        except Exception as err:  # noqa: BLE001 - one variant's failure (out of memory) must not lose the others
            row, failed = {"error": f"{type(err).__name__}: {err}"}, 1
        out["variants"][name] = {"slot": slot, **row}
        print(f"[peer] {name}: {json.dumps(row)}", flush=True)
        path.write_text(json.dumps(out, indent=2))
        if device == "cuda":
            torch.cuda.empty_cache()
    return failed


if __name__ == "__main__":
    sys.exit(main())
