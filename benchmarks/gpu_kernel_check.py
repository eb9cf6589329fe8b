"""GPU correctness check of the fused copy kernels at real sizes (run on a CUDA machine, < 1 min).

Fused vs the naive PyTorch reference at T=4096, b=2, H_c=4, d_c in {64, 128}: bf16 and fp32 inputs,
and FP8 (straight-through, against the reference on the dequantized inputs; one scale per tensor as the
copy head quantizes, and one per block of 128 rows). Documents of ~700 tokens, 5% ignored labels, small
label vocabulary (so matches exist), random output gradients. Also: one-document (no doc_ids) cases, strided
q/k views, bitwise determinism, no NaN on empty rows; one case at b=1, whose grid is small enough
(b*H*T < cplm_kernels.configs.SMALL_GRID_ROWS) for the forward's small-grid tiles. The cases without
documents compile the kernels the benchmark (benchmarks/copy_kernel.py) then finds in Triton's cache.

Tolerances (max |fused - ref| / max |ref|, per tensor): fp32 1e-5 (tl.dot in ieee fp32),
bf16 2e-2 and FP8 2e-2 (bf16 dS in the gradient matmuls; fp8 tensor-core accumulation).

    python -m benchmarks.gpu_kernel_check [--json OUT.json]
    python -m benchmarks.gpu_kernel_check --tiny   # CPU dry run: T=64, b=1, kernels in the Triton interpreter
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

if "--tiny" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before cplm_kernels defines the kernels

import cplm_kernels as ck  # noqa: E402
from benchmarks.common import rel_err  # noqa: E402
from benchmarks.partial_results import write_partial  # noqa: E402
from cplm_kernels.configs import select_configs  # noqa: E402

HEADS, N_LABELS = 4, 64


class Sizes(NamedTuple):
    """The check's sequence length, largest batch and device."""

    T: int
    batch: int
    device: str


REAL, TINY = Sizes(4096, 2, "cuda"), Sizes(64, 1, "cpu")  # --tiny: the CPU dry run
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp8": 2e-2, "fp8-rows": 2e-2}
FP8_BLOCK_ROWS = 128  # "fp8-rows": one scale per 128 rows of each head


def make_inputs(size: Sizes, d: int, dtype: torch.dtype, with_docs: bool, seed: int, batch: int):
    T, device = size.T, size.device
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, HEADS, T, d, device=device, generator=gen).to(dtype)
    k = torch.randn(batch, HEADS, T, d, device=device, generator=gen).to(dtype)
    labels = torch.randint(0, N_LABELS, (batch, T), device=device, generator=gen)
    labels[torch.rand(batch, T, device=device, generator=gen) < 0.05] = -100
    doc_ids = None
    if with_docs:
        doc_ids = torch.cumsum(torch.rand(batch, T, device=device, generator=gen) < min(1 / 700, 4 / T), dim=1)
    grads = torch.randn(2, batch, HEADS, T, device=device, generator=gen)
    return q, k, labels, doc_ids, grads[0], grads[1]


def outputs_and_grads(fn: Callable, q, k, labels, doc_ids, g_all, g_match) -> tuple[torch.Tensor, ...]:
    q = q.detach().requires_grad_()
    k = k.detach().requires_grad_()
    lse_all, lse_match = fn(q, k, labels, doc_ids)
    finite_all, finite_match = torch.isfinite(lse_all), torch.isfinite(lse_match)
    loss = (torch.where(finite_all, lse_all, 0.0) * g_all).sum() + (torch.where(finite_match, lse_match, 0.0)
                                                                    * g_match).sum()
    dq, dk = torch.autograd.grad(loss, (q, k))
    return lse_all.detach(), lse_match.detach(), dq, dk


def reference_for(kind: str, q, k):
    """(reference q, reference k): FP8 compares against the reference on the dequantized values."""
    if not kind.startswith("fp8"):
        return q, k
    rows = FP8_BLOCK_ROWS if kind == "fp8-rows" else None
    (q8, qs), (k8, ks) = ck.quantize_fp8(q, rows), ck.quantize_fp8(k, rows)
    return ck.dequantize_fp8(q8, qs, rows), ck.dequantize_fp8(k8, ks, rows)


def fused_for(kind: str) -> Callable:
    """The fused entry point of ``kind``: FP8 straight-through (per tensor or per block of rows), or plain."""
    if kind == "fp8-rows":
        return functools.partial(ck.copy_lse_fused_fp8, block_rows=FP8_BLOCK_ROWS)
    return ck.copy_lse_fused_fp8 if kind == "fp8" else ck.copy_lse_fused


def check_case(size: Sizes, d: int, kind: str, with_docs: bool, strided: bool = False, batch: int = 2
               ) -> dict[str, object]:
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    T, device = size.T, size.device
    batch = min(batch, size.batch)  # --tiny: b=1
    q, k, labels, doc_ids, g_all, g_match = make_inputs(size, d, dtype, with_docs, seed=d, batch=batch)
    if strided:  # [b, H, T, d] views of one [T, b, 2 * H * d] projection, as the head produces them
        proj = torch.cat([q, k], dim=1).permute(2, 0, 1, 3).reshape(T, batch, 2 * HEADS * d).contiguous()
        q = proj[..., : HEADS * d].reshape(T, batch, HEADS, d).permute(1, 2, 0, 3)
        k = proj[..., HEADS * d:].reshape(T, batch, HEADS, d).permute(1, 2, 0, 3)
    fused_fn = fused_for(kind)
    start = time.perf_counter()
    fused = outputs_and_grads(fused_fn, q, k, labels, doc_ids, g_all, g_match)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    again = outputs_and_grads(fused_fn, q, k, labels, doc_ids, g_all, g_match)
    deterministic = all(torch.equal(a, b) for a, b in zip(fused, again))
    ref_q, ref_k = reference_for(kind, q, k)
    ref = outputs_and_grads(ck.copy_lse_naive, ref_q, ref_k, labels, doc_ids, g_all, g_match)
    ref = ref[:2] + tuple(g.to(fused[2].dtype) for g in ref[2:])
    errors = {name: rel_err(a, e) for name, a, e in zip(("lse_all", "lse_match", "dq", "dk"), fused, ref)}
    empty_rows_ok = bool(torch.isneginf(fused[0][:, :, 0]).all()) and not any(torch.isnan(t).any() for t in fused)
    ok = max(errors.values()) <= TOLERANCE[kind] and deterministic and empty_rows_ok
    tile = select_configs(d, dtype, interpret=device == "cpu", rows=batch * HEADS * T).forward
    return {"d": d, "kind": kind, "docs": with_docs, "strided": strided, "batch": batch, "errors": errors,
            "deterministic": deterministic, "empty_rows_ok": empty_rows_ok, "first_call_s": seconds,
            "forward_tile": f"{tile.block_m}x{tile.block_n}", "ok": ok}


# (d, kind, documents, strided views, batch): first the benchmark's kernels (no documents, contiguous or strided
# alike to Triton's cache), then documents, FP8 per block of rows, and the exact fp32 path
CASES: list[tuple[int, str, bool, bool, int]] = [
    (64, "bf16", False, True, 2), (64, "bf16", False, False, 1), (64, "fp8", False, False, 2),
    (128, "bf16", False, False, 2), (128, "fp8", False, False, 2), (64, "bf16", True, False, 2),
    (128, "fp8-rows", True, False, 2), (64, "fp32", True, False, 2), (128, "fp32", True, False, 2),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fused copy kernels vs the naive reference at real sizes (GPU)")
    parser.add_argument("--json", help="write every case's errors and verdict to this file")
    parser.add_argument("--tiny", action="store_true",
                        help="CPU dry run of this script: T=64, b=1, kernels in the Triton interpreter")
    args = parser.parse_args(argv)
    size = TINY if args.tiny else REAL
    if not args.tiny and not torch.cuda.is_available():
        print("gpu_kernel_check needs a CUDA device (or --tiny for a CPU dry run)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32, not tf32
    device_name = torch.cuda.get_device_name() if size.device == "cuda" else "cpu (Triton interpreter)"
    print(f"# fused copy kernels vs naive reference on {device_name}, T={size.T}, b={size.batch}, "
          f"H_c={HEADS}; tolerances {TOLERANCE}", flush=True)
    started = time.perf_counter()
    results: list[dict[str, object]] = []

    def payload() -> dict[str, object]:
        failures = sum(not r["ok"] for r in results)
        return {"device": device_name, "T": size.T, "batch": size.batch, "heads": HEADS, "tolerance": TOLERANCE,
                "cases": results, "passed": failures == 0 and len(results) == len(CASES)}

    for d, kind, docs, strided, batch in CASES:
        try:
            result = check_case(size, d, kind, docs, strided, batch)
        except Exception as err:  # noqa: BLE001 -- report and continue: the other cases still tell something
            result = {"d": d, "kind": kind, "docs": docs, "strided": strided, "batch": batch, "ok": False,
                      "error": f"{type(err).__name__}: {err}"}
            print(f"FAIL d={d} {kind} docs={docs} strided={strided} b={batch}: {result['error']}", flush=True)
            results.append(result)
            write_partial(args.json, payload())
            continue
        results.append(result)
        write_partial(args.json, payload())
        errs = " ".join(f"{k}={v:.2e}" for k, v in result["errors"].items())
        print(f"{'PASS' if result['ok'] else 'FAIL'} d={d:3d} {kind:8s} docs={docs!s:5s} strided={strided!s:5s} "
              f"b={result['batch']} fwd={result['forward_tile']} {errs} deterministic={result['deterministic']} "
              f"empty_rows_ok={result['empty_rows_ok']} (first call {result['first_call_s']:.1f} s incl. compile)",
              flush=True)
    failures = sum(not r["ok"] for r in results)
    print(f"# {'PASS' if failures == 0 else f'FAIL ({failures} cases)'} in {time.perf_counter() - started:.1f} s")
    write_partial(args.json, payload(), complete=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
