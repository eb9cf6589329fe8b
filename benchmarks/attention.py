"""Core attention with document masking, forward+backward: every available document backend vs SDPA with a
dense mask (the reference).

The variants are `cplm_megatron.model.attention.SDPAttention` given what the step would pass:

* ``dense``: megatron's boolean ``[b, 1, s, s]`` mask (built once per micro-batch, like the step did before):
  SDPA's memory-efficient kernel with an additive bias -- the reference, run first;
* ``causal``: no document mask at all (``is_causal``, flash): the floor, and a different attention;
* ``documents:<backend>``: the document ids (`model/document_mask.py`), no ``[s, s]`` tensor, by each backend
  that runs here (`available_document_backends`): ``varlen`` (torch's flash varlen kernel, CUDA),
  ``njt`` (nested jagged tensors through SDPA, CUDA), ``per_document`` (one SDPA call per document). The model
  picks the first available one at build (``selected`` in the JSON); these rows settle whether that is right.

Each variant's row (time, extra memory, agreement with ``dense``) is written as soon as it finishes.

Sizes: SmolLM2-1.7B's attention (32 heads, 32 k/v groups, head dim 64) at seq 8192 (micro 1) and 2048 (micro 4),
bf16 on GPU; documents of random lengths (mean ~1k tokens). Memory is the peak beyond the inputs, the outputs
and their gradients (the CUDA allocator; torch's MemTracker on CPU); time the median of interleaved
repetitions after a warm-up call. The document backends and ``dense`` compute the same function: their
outputs and q/k/v gradients are compared (max relative error).

    python -m benchmarks.attention --json OUT.json [--quick]    # --quick: tiny sizes on CPU (a smoke run)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from benchmarks.common import HAS_CUDA, memory_probe, rel_err
from benchmarks.common import sync as _sync
from benchmarks.partial_results import write_partial
from benchmarks.ratios import ratio


def variants() -> List[str]:
    """dense (the reference) first, causal, then every document backend that runs on this machine."""
    from cplm_megatron.model.document_mask import available_document_backends, varlen_attn_function

    return ["dense", "causal", *(f"documents:{b}" for b in available_document_backends(HAS_CUDA, varlen_attn_function()))]


def _init() -> None:
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig, free_port
    from cplm_megatron.parallel.megatron_patches import setup_compat

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    setup_compat()
    init_distributed(ParallelConfig(), ModelConfig(), seed=1)


def document_ids(batch: int, seq: int, mean_len: int, device: torch.device) -> torch.Tensor:
    """[b, s] ids of documents with geometric lengths (a fixed seed: every variant sees the same ones)."""
    g = torch.Generator().manual_seed(0)
    starts = torch.rand(batch, seq, generator=g) < 1.0 / mean_len
    return torch.cumsum(starts, dim=1).to(device)


def make_core(heads: int, groups: int, head_dim: int, dtype: torch.dtype):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from cplm_megatron.model.attention import SDPAttention

    config = TransformerConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=head_dim, params_dtype=dtype,
                               bf16=dtype == torch.bfloat16, attention_dropout=0.0)
    return SDPAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")


def runner(core, inputs: List[torch.Tensor], grad: torch.Tensor, mask: Optional[torch.Tensor]) -> Callable:
    from cplm_megatron.model.document_mask import document_ids_mask

    def run() -> Tuple[torch.Tensor, ...]:
        for t in inputs:
            t.grad = None
        # a fresh mask object per call, as the step makes one per micro-batch (the dense bias rides on it)
        fresh = None if mask is None else (document_ids_mask(mask[:, 0, 0]) if mask.dtype != torch.bool
                                           else mask.clone())
        out = core(*inputs, fresh)
        out.backward(grad)
        result = (out.detach(), *(t.grad for t in inputs))
        for t in inputs:
            t.grad = None
        return result

    return run


def peak_bytes(run: Callable, inputs: List[torch.Tensor]) -> Tuple[int, Tuple[torch.Tensor, ...]]:
    """Peak memory of one call beyond its inputs, outputs and gradients."""
    with memory_probe(inputs) as probe:
        out = run()
    returned = sum(t.numel() * t.element_size() for t in out)
    return probe.peak - returned, out


def bench_size(heads: int, groups: int, head_dim: int, seq: int, batch: int, mean_len: int, dtype: torch.dtype,
               reps: int, on_row: Callable[[Dict[str, Any]], None]) -> None:
    """Every variant at one size, one after the other; a row per variant as soon as it is measured."""
    from cplm_megatron.model.document_mask import dense_document_mask, document_ids_mask

    device = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
    core = make_core(heads, groups, head_dim, dtype)
    selected = core.document_backend
    g = torch.Generator(device=device).manual_seed(1)
    inputs = [torch.randn(seq, batch, n, head_dim, generator=g, device=device).to(dtype).requires_grad_()
              for n in (heads, groups, groups)]
    grad = torch.randn(seq, batch, heads * head_dim, generator=g, device=device).to(dtype)
    ids = document_ids(batch, seq, mean_len, device)
    size = dict(heads=heads, groups=groups, head_dim=head_dim, seq=seq, batch=batch, dtype=str(dtype).split(".")[-1],
                documents=int(ids[:, -1].sum() + batch), device=str(device))
    reference = None
    for name in variants():
        backend = name.split(":", 1)[1] if name.startswith("documents:") else None
        row: Dict[str, Any] = dict(size, variant=name, backend=backend, selected_at_build=backend == selected)
        mask = {"dense": dense_document_mask(document_ids_mask(ids)), "causal": None}.get(name, document_ids_mask(ids))
        core.document_backend = backend or selected
        try:
            run = runner(core, inputs, grad, mask)
            row["extra_bytes"], out = peak_bytes(run, inputs)
            times = []
            for rep in range(reps + 1):  # the first call warms up
                _sync()
                start = time.perf_counter()
                run()
                _sync()
                if rep:
                    times.append(time.perf_counter() - start)
            row["seconds"] = statistics.median(times)
            row["status"] = "ok"
            if name == "dense":
                reference = out
            elif backend and reference is not None:
                row["max_rel_err_vs_dense"] = max(rel_err(a, b) for a, b in zip(out, reference))
        except Exception as err:  # noqa: BLE001 - one variant's failure must not lose the others
            row["status"] = f"error: {type(err).__name__}: {err}"[:300]
            if HAS_CUDA and isinstance(err, torch.cuda.OutOfMemoryError):
                torch.cuda.empty_cache()
        print(f"{name:22s} b={batch} seq={seq:6d} heads={heads}/{groups} d={head_dim} {row['dtype']:8s} "
              f"{row.get('seconds', float('nan')):8.4f} s  extra {row.get('extra_bytes', 0) / 2**20:9.1f} MiB  "
              f"{row['status']}", flush=True)
        on_row(row)
    core.document_backend = selected


def ratios(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per size and document backend: time and memory vs dense (and vs causal, the floor), agreement with dense."""
    out = []
    for seq, batch in sorted({(r["seq"], r["batch"]) for r in rows}):
        by = {r["variant"]: r for r in rows if (r["seq"], r["batch"]) == (seq, batch) and r["status"] == "ok"}
        for doc in by.values():
            if not doc.get("backend"):
                continue
            entry: Dict[str, Any] = {"seq": seq, "batch": batch, "dtype": doc["dtype"], "backend": doc["backend"],
                                     "selected_at_build": doc["selected_at_build"],
                                     "max_rel_err_vs_dense": doc.get("max_rel_err_vs_dense")}
            for other in ("dense", "causal"):
                reference = by.get(other, {})
                figures = {"time": ratio(doc.get("seconds"), reference.get("seconds")),
                           "memory": ratio(doc.get("extra_bytes"), reference.get("extra_bytes"))}
                entry.update({f"{kind}_vs_{other}": v for kind, v in figures.items() if v is not None})
            out.append(entry)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write rows and ratios to this file (after every variant)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    _init()
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    if args.quick:
        plan = [(4, 2, 16, 128, 2, 32)]
    else:
        plan = [(32, 32, 64, 8192, 1, 1024), (32, 32, 64, 2048, 4, 1024)]
    reps = 2 if args.quick else args.reps
    rows: List[Dict[str, Any]] = []
    device = torch.cuda.get_device_name() if HAS_CUDA else "cpu"

    from cplm_megatron.model.document_mask import select_document_backend

    head = {"device": device, "torch": torch.__version__, "selected_backend": select_document_backend(HAS_CUDA),
            "variants": variants()}

    def on_row(row: Dict[str, Any]) -> None:
        rows.append(row)
        write_partial(args.json, {**head, "rows": rows, "ratios": ratios(rows)})

    for heads, groups, head_dim, seq, batch, mean_len in plan:
        bench_size(heads, groups, head_dim, seq, batch, mean_len, dtype, reps, on_row)
    write_partial(args.json, {**head, "rows": rows, "ratios": ratios(rows)}, complete=True)
    failed = [r for r in rows if r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
