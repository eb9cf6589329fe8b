"""Compile the fused kernels (copy scores, cross-entropy tiles) for a GPU without one (Triton AOT).

Catches GPU-only compile errors (dot shapes, fp8 operand rules, layouts, shared memory) on CPU
machines with the ptxas bundled in the triton wheel, and prints registers / spill stack per thread.
Argument types and specializations mirror what Triton's launcher derives at run time (ints equal
to 1 become constants, multiples of 16 and pointers get divisibility hints). Needs TRITON_INTERPRET unset.

Usage: ``python -m cplm_kernels.aot_check [--arch 90] [--quick]``
"""
from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import torch

from cplm_kernels.configs import SMALL_GRID_ROWS, SUPPORTED_HEAD_DIMS, select_configs
from cplm_kernels.fp8 import FP8_DTYPE
from cplm_kernels.fused import (
    KernelCall,
    KernelOperands,
    RowScale,
    forward_call,
    grad_call,
    make_launch,
    stats_call,
)

_POINTER_TYPES = {
    torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", FP8_DTYPE: "fp8e4nv",
    torch.int64: "i64", torch.int32: "i32",
}


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unsupported kernel argument {value!r}")


def triton_source(call: KernelCall):
    """An ASTSource for ``call`` with the launcher's specializations."""
    from triton.compiler import ASTSource

    kernel = call.kernel
    names = kernel.arg_names
    runtime_args = dict(zip([n for n in names if n not in call.constexprs], call.args))
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = dict(call.constexprs)
    attrs: dict[tuple[int], list] = {}
    for index, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        value = runtime_args[name]
        if isinstance(value, int) and not isinstance(value, bool) and value == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
            continue
        signature[name] = _arg_type(value)
        if isinstance(value, torch.Tensor) or (isinstance(value, int) and value % 16 == 0):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def compile_call(call: KernelCall, arch: int):
    """Compile one launch for ``sm_{arch}``; returns Triton's compiled-kernel object."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options({"num_warps": call.num_warps, "num_stages": call.num_stages})
    return triton.compile(triton_source(call), target=target, options=options.__dict__)


def register_usage(cubin: bytes) -> str:
    """Registers and spill stack per thread (``cuobjdump -res-usage`` from the triton wheel), or ''."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True, check=False).stdout
    fields = [f for line in out.splitlines() if "REG:" in line for f in line.split() if f.split(":")[0] in
              ("REG", "STACK")]
    return " ".join(fields)


def representative_calls(head_dim: int, dtype: torch.dtype, with_docs: bool, arch: int,
                         T: int = 1000) -> Iterator[tuple[str, KernelCall]]:
    """The forward, statistics, dQ and dK launches of one (head_dim, dtype, documents) variant, on CPU tensors
    (FP8: one scale per tensor, as the copy head quantizes, without documents; per block of 128 rows with)."""
    b, H = 1, 4
    q = torch.zeros(b, H, T, head_dim).to(dtype)
    k = torch.zeros(b, H, T, head_dim).to(dtype)
    labels = torch.zeros(b, T, dtype=torch.long)
    doc_ids = torch.zeros(b, T, dtype=torch.long) if with_docs else None
    if dtype == FP8_DTYPE:
        scales = RowScale(torch.ones(b, H, 8), (H * 8, 8, 1), 128) if with_docs else RowScale(torch.ones(1), (0, 0, 0), 1)
        ops = KernelOperands(q, k, scales, scales)
    else:
        ops = KernelOperands(q, k, RowScale.unused(q.device), RowScale.unused(q.device))
    capability = (arch // 10, arch % 10)
    launch = make_launch(ops, labels, doc_ids, None, capability,
                         configs=select_configs(head_dim, dtype, interpret=False, rows=SMALL_GRID_ROWS))
    lse = torch.zeros(b, H, T)
    grad_dtype = torch.bfloat16 if dtype == FP8_DTYPE else dtype
    out = torch.zeros(b, H, T, head_dim, dtype=grad_dtype)
    stats, exact = torch.zeros(5, b * H * T), torch.zeros(b * H, T, dtype=torch.int32)
    yield "forward", forward_call(launch, lse, lse)
    small = make_launch(ops, labels, doc_ids, None, capability)  # b * H * T < SMALL_GRID_ROWS: small-grid tiles
    if small.configs.forward != launch.configs.forward:
        yield "fwd_small", forward_call(small, lse, lse)
    yield "stats", stats_call(launch, lse, lse, lse, lse, stats, exact)
    yield "grad_q", grad_call(launch, "q", stats, exact, out)
    yield "grad_k", grad_call(launch, "k", stats, exact, out)


def representative_ce_calls(dtype: torch.dtype) -> Iterator[tuple[str, KernelCall]]:
    """The linear cross entropy's two tile kernels on a [1024, 16384] logits tile of ``dtype``."""
    from cplm_kernels.linear_ce import grad_call, stats_call

    tile = torch.zeros(1024, 16384, dtype=dtype)
    target_col = torch.zeros(1024, dtype=torch.int64)
    row = torch.zeros(1024)
    yield "ce_stats", stats_call(tile, target_col, row, row, row, interpreted=False)
    yield "ce_grad", grad_call(tile, target_col, row, interpreted=False)


def ce_variants(quick: bool) -> list[torch.dtype]:
    return [torch.bfloat16, torch.float32] if quick else [torch.bfloat16, torch.float16, torch.float32]


def variants(quick: bool) -> list[tuple[int, torch.dtype, bool]]:
    if quick:
        return [(64, torch.bfloat16, True), (128, FP8_DTYPE, False), (32, torch.float32, True)]
    dtypes = (torch.bfloat16, torch.float16, torch.float32, FP8_DTYPE)
    return list(itertools.product(SUPPORTED_HEAD_DIMS, dtypes, (False, True)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an int (90 = H100/H200)")
    parser.add_argument("--quick", action="store_true",
                        help="three copy-kernel variants and two cross-entropy dtypes only")
    args = parser.parse_args(argv)
    from cplm_kernels import triton_copy
    from cplm_kernels.interpreter import kernels_are_interpreted

    if kernels_are_interpreted(triton_copy.copy_lse_fwd_kernel):
        print("aot_check needs TRITON_INTERPRET unset (kernels were built for the interpreter)", file=sys.stderr)
        return 2
    calls = [(f"{name:7s} d={head_dim:3d} {str(dtype).replace('torch.', ''):14s} docs={with_docs}", call)
             for head_dim, dtype, with_docs in variants(args.quick)
             for name, call in representative_calls(head_dim, dtype, with_docs, args.arch)]
    calls += [(f"{name:8s} {str(dtype).replace('torch.', ''):14s}", call)
              for dtype in ce_variants(args.quick) for name, call in representative_ce_calls(dtype)]
    failures = 0
    for what, call in calls:
        label = f"sm_{args.arch} {what}"
        start = time.perf_counter()
        try:
            compiled = compile_call(call, args.arch)
        except Exception as err:  # noqa: BLE001 -- report every variant, then fail
            failures += 1
            print(f"FAIL {label}: {type(err).__name__}: {err}", flush=True)
            continue
        print(f"ok   {label}  shared={compiled.metadata.shared:6d} B  {register_usage(compiled.asm['cubin'])}  "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    print("PASS" if failures == 0 else f"FAIL ({failures} variants)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
