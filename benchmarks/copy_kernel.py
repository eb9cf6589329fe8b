"""Benchmark the Copy-Paste score implementations: naive torch, chunked torch, fused Triton (bf16, FP8).

Times forward and forward+backward and measures peak extra memory (CUDA: max_memory_allocated
during the call minus what was allocated before it, i.e. beyond the inputs) for T in
{1k, 4k, 16k, 32k}, d_c in {64, 128}, H_c = 4, b = 1, one document, ~5% ignored labels; plus d_c = 128
rows at --d128-seq-lens (default 8k and 16k on a GPU), where FP8 tensor cores can pay off (the FP8
question: does FP8 beat bf16 at d_c = 128?). Comparison row: torch SDPA with the flash backend,
causal, q/k/v of the same [b, H_c, T, d_c] shape (all H_c heads; attention additionally does the P @ V
product).

On CPU it times the torch implementations at T <= 4k in fp32 (memory: torch's MemTracker) and runs the fused kernels in the
Triton interpreter at tiny T (labelled: correctness path, not a speed measurement).

    python -m benchmarks.copy_kernel [--json OUT.json] [--quick] [--sweep-tiles] [--seq-lens T ...] [--head-dims d ...]
                                     [--d128-seq-lens [T ...]]   # no values: no extra d_c = 128 rows
    python -m benchmarks.copy_kernel --gpu-row-set --seq-lens 64 128 --head-dims 32   # the GPU table's rows on CPU
        (fused kernels interpreted; d_c = 128 at T = 32): a dry run of the GPU benchmark, not a measurement
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Triton picks interpreter vs GPU when the kernels are defined: set before cplm_kernels.fused loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import cplm_kernels as ck  # noqa: E402
from benchmarks.common import memory_probe  # noqa: E402
from benchmarks.common import sync as _sync  # noqa: E402
from benchmarks.partial_results import write_partial  # noqa: E402
from benchmarks.ratios import ok_row, ratio  # noqa: E402
from cplm_kernels.configs import KernelConfigs, TileConfig  # noqa: E402

HEADS, BATCH, VOCAB = 4, 1, 1000
GPU_SEQ_LENS = (1024, 4096, 16384, 32768)
GPU_D128_SEQ_LENS = (8192, 16384)  # the FP8 question at d_c = 128, T >= 8k
DRY_RUN_D128_SEQ_LENS = (32,)
MEMORY_TARGET_T = 32768


@dataclass
class Row:
    """One measurement (times in ms, memory in bytes; None where not measured)."""

    impl: str
    dtype: str
    T: int
    d: int
    mode: str  # "fwd" or "fwd+bwd"
    time_ms: float | None = None
    extra_mem_bytes: int | None = None
    status: str = "ok"
    note: str = ""
    heads: int = HEADS
    batch: int = BATCH


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    labels: torch.Tensor
    g_all: torch.Tensor
    g_match: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def make_inputs(T: int, d: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(BATCH, HEADS, T, d, device=device, generator=gen).to(dtype).requires_grad_()
    k = torch.randn(BATCH, HEADS, T, d, device=device, generator=gen).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (BATCH, T), device=device, generator=gen)
    labels[torch.rand(BATCH, T, device=device, generator=gen) < 0.05] = -100
    g = torch.randn(2, BATCH, HEADS, T, device=device, generator=gen)
    return Inputs(q, k, labels, g[0], g[1])


# ---- the implementations: each returns a callable running one forward (or forward+backward) ----

def _lse_runner(fn: Callable, inp: Inputs, backward: bool, q=None, k=None, **kw) -> Callable[[], None]:
    q = inp.q if q is None else q
    k = inp.k if k is None else k

    def run() -> None:
        with torch.set_grad_enabled(backward):
            lse_all, lse_match = fn(q, k, inp.labels, **kw)
            if backward:
                torch.autograd.grad((lse_all, lse_match), (inp.q, inp.k), (inp.g_all, inp.g_match))

    return run


def naive(inp: Inputs, backward: bool) -> Callable[[], None]:
    return _lse_runner(ck.copy_lse_naive, inp, backward)


def chunked(inp: Inputs, backward: bool) -> Callable[[], None]:
    return _lse_runner(ck.copy_lse_chunked, inp, backward)


def fused(inp: Inputs, backward: bool, configs: KernelConfigs | None = None) -> Callable[[], None]:
    return _lse_runner(ck.copy_lse_fused, inp, backward, configs=configs)


def fused_fp8(inp: Inputs, backward: bool) -> Callable[[], None]:
    """Forward: pre-quantized fp8 q/k (kernel only). Forward+backward: straight-through incl. quantization."""
    if backward:
        return _lse_runner(ck.copy_lse_fused_fp8, inp, True)
    if "q8" not in inp.extra:
        inp.extra["q8"], inp.extra["q_scale"] = ck.quantize_fp8(inp.q)
        inp.extra["k8"], inp.extra["k_scale"] = ck.quantize_fp8(inp.k)
    e = inp.extra
    return _lse_runner(ck.copy_lse_fused, inp, False, q=e["q8"], k=e["k8"], q_scale=e["q_scale"],
                       k_scale=e["k_scale"])


def sdpa_flash(inp: Inputs, backward: bool) -> Callable[[], None]:
    """Causal flash attention on q/k/v shaped like the copy head's q/k (v = a third such tensor)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if "v" not in inp.extra:
        inp.extra["v"] = torch.randn_like(inp.k).requires_grad_()
        inp.extra["g_out"] = torch.randn_like(inp.k)
    v, g_out = inp.extra["v"], inp.extra["g_out"]

    def run() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.set_grad_enabled(backward):
            out = torch.nn.functional.scaled_dot_product_attention(inp.q, inp.k, v, is_causal=True)
            if backward:
                torch.autograd.grad(out, (inp.q, inp.k, v), g_out)

    return run


# ---- measurement ----

def time_ms(run: Callable[[], None], budget_s: float, max_reps: int) -> float:
    """Mean time of ``run`` after one warm-up (which also compiles), CUDA events on GPU."""
    run()
    _sync()
    reps = 1
    if max_reps > 1:  # a probe run sizes the repetitions to the budget
        start = time.perf_counter()
        run()
        _sync()
        reps = max(1, min(max_reps, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    if not HAS_CUDA:
        start = time.perf_counter()
        for _ in range(reps):
            run()
        return (time.perf_counter() - start) / reps * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / reps


def extra_memory_bytes(run: Callable[[], None], inputs: list[torch.Tensor]) -> int | None:
    """Peak bytes allocated during ``run`` beyond its inputs: CUDA's allocator statistics on GPU; on CPU,
    torch's MemTracker (a dispatch mode that follows every tensor's storage) with the inputs pre-registered."""
    with memory_probe(inputs) as probe:
        run()
    return probe.peak


def _free() -> None:
    gc.collect()
    if HAS_CUDA:
        torch.cuda.empty_cache()


def measure(row: Row, budget_s: float, max_reps: int, make_run: Callable[..., Callable[[], None]], *args,
            **kwargs) -> Row:
    """Fill ``row`` with the memory and time of ``make_run(*args, **kwargs)()``; OOM and errors are recorded."""
    try:
        run = make_run(*args, **kwargs)
        inputs = [t for a in args if isinstance(a, Inputs) for t in (a.q, a.k, a.labels, a.g_all, a.g_match)]
        row.extra_mem_bytes = extra_memory_bytes(run, inputs)
        row.time_ms = time_ms(run, budget_s, max_reps)
    except torch.OutOfMemoryError:
        row.status = "skipped: OOM"
    except Exception as err:  # noqa: BLE001 -- one failing implementation must not lose the rest of the table
        row.status = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    finally:
        _free()
    return row


def naive_scores_bytes(T: int) -> int:
    """Theoretical size of one fp32 [b, H, T, T] score tensor (the naive path holds several)."""
    return BATCH * HEADS * T * T * 4


# ---- plans ----

@dataclass(frozen=True)
class Plan:
    seq_lens: tuple[int, ...]
    head_dims: tuple[int, ...]
    interp_seq_lens: tuple[int, ...]
    budget_s: float
    max_reps: int
    d128_seq_lens: tuple[int, ...] = ()  # GPU table: extra d_c = 128 rows at these T

    def gpu_shapes(self) -> list[tuple[int, int]]:
        """(d, T) of the GPU table: head_dims x seq_lens, then the extra d_c = 128 rows."""
        shapes = [(d, T) for d in self.head_dims for T in self.seq_lens]
        return shapes + [(128, T) for T in self.d128_seq_lens if (128, T) not in shapes]


def make_plan(quick: bool, seq_lens: tuple[int, ...] | None = None, head_dims: tuple[int, ...] | None = None,
              d128_seq_lens: tuple[int, ...] | None = None, gpu_row_set: bool = False) -> Plan:
    """The default sizes for this device (`quick`: the smallest), with explicit sizes replacing them
    (``d128_seq_lens=()``: no extra d_c = 128 rows)."""
    plan = _default_plan(quick)
    if d128_seq_lens is None:
        d128_seq_lens = GPU_D128_SEQ_LENS if HAS_CUDA and not quick else DRY_RUN_D128_SEQ_LENS if gpu_row_set else ()
    return Plan(seq_lens or plan.seq_lens, head_dims or plan.head_dims, plan.interp_seq_lens, plan.budget_s,
                plan.max_reps, tuple(d128_seq_lens))


def _default_plan(quick: bool) -> Plan:
    if HAS_CUDA:
        return Plan(GPU_SEQ_LENS[:2] if quick else GPU_SEQ_LENS, (64,) if quick else (64, 128), (), 0.2, 50)
    return Plan((256,) if quick else (256, 1024, 4096), (64,) if quick else (64, 128), (64,) if quick else (64, 128),
                0.2, 5)


def gpu_rows(plan: Plan, log: Callable[[Row], None]) -> list[Row]:
    rows: list[Row] = []
    device = torch.device("cuda" if HAS_CUDA else "cpu")  # CPU: --gpu-row-set dry run, fused kernels interpreted
    impls = [("naive", naive), ("chunked", chunked), ("fused", fused), ("sdpa-flash", sdpa_flash)]
    max_reps = plan.max_reps if HAS_CUDA else 1  # the dry run times nothing worth repeating
    for d, T in plan.gpu_shapes():
        inp = make_inputs(T, d, torch.bfloat16, device)
        for mode in ("fwd", "fwd+bwd"):
            backward = mode == "fwd+bwd"
            for name, impl in impls:
                row = Row(name, "bf16", T, d, mode)
                if name == "sdpa-flash":
                    row.note = f"causal attention, {HEADS} heads of the same [b,H,T,d] shape, v extra"
                rows.append(log(measure(row, plan.budget_s, max_reps, impl, inp, backward)))
            note = "pre-quantized fp8 q/k" if not backward else "straight-through, includes quantize_fp8"
            row = Row("fused", "fp8", T, d, mode, note=note)
            rows.append(log(measure(row, plan.budget_s, max_reps, fused_fp8, inp, backward)))
        del inp
        _free()
    return rows


def cpu_rows(plan: Plan, log: Callable[[Row], None]) -> list[Row]:
    rows: list[Row] = []
    device = torch.device("cpu")
    for d in plan.head_dims:
        for T in plan.seq_lens:
            inp = make_inputs(T, d, torch.float32, device)
            for mode in ("fwd", "fwd+bwd"):
                for name, impl in (("naive", naive), ("chunked", chunked)):
                    row = Row(name, "fp32", T, d, mode, note="CPU")
                    rows.append(log(measure(row, plan.budget_s, plan.max_reps, impl, inp, mode == "fwd+bwd")))
    if not ck.fused_available():
        return rows
    note = "Triton CPU interpreter: correctness path, NOT a speed measurement"
    for d in plan.head_dims:
        for T in plan.interp_seq_lens:
            inp = make_inputs(T, d, torch.float32, device)
            for mode in ("fwd", "fwd+bwd"):
                backward = mode == "fwd+bwd"
                for dtype, impl in (("fp32", fused), ("fp8", fused_fp8)):
                    row = Row("fused (interpreter)", dtype, T, d, mode, note=note)
                    rows.append(log(measure(row, 0.0, 1, impl, inp, backward)))
    return rows


# Alternatives to the table (cplm_kernels/configs.py), first entry = the table's (large grid): TileConfig(block_m
# query rows, block_n key rows, warps, stages); no entry spills registers on sm_90 (python -m cplm_kernels.aot_check).
SWEEP_FORWARD = (TileConfig(128, 64, 4, 3), TileConfig(128, 64, 4, 2), TileConfig(64, 64, 4, 3),
                 TileConfig(128, 32, 4, 3), TileConfig(64, 128, 4, 3), TileConfig(128, 128, 8, 3))
SWEEP_GRAD_Q = (TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 3), TileConfig(64, 128, 4, 2),
                TileConfig(64, 128, 8, 3), TileConfig(32, 64, 4, 3))
SWEEP_GRAD_K = (TileConfig(64, 64, 4, 2), TileConfig(64, 64, 4, 3), TileConfig(64, 128, 8, 3),
                TileConfig(128, 64, 8, 3), TileConfig(128, 128, 8, 3))


def sweep_tiles(head_dims: tuple[int, ...], T: int = 16384) -> list[dict]:
    """Time alternative tiles per kernel (bf16) on the GPU; the fastest are candidates for configs.py."""
    from cplm_kernels.configs import select_configs

    results = []
    for d in head_dims:
        base = select_configs(d, torch.bfloat16, interpret=False, rows=BATCH * HEADS * T)
        inp = make_inputs(T, d, torch.bfloat16, torch.device("cuda"))
        for kernel, options in (("forward", SWEEP_FORWARD), ("grad_q", SWEEP_GRAD_Q), ("grad_k", SWEEP_GRAD_K)):
            for tile in options:
                configs = KernelConfigs(**{**asdict_shallow(base), kernel: tile})
                # forward alone; dQ alone (k frozen); dK alone (q frozen): one backward kernel each
                row = Row("fused", "bf16", T, d, kernel, note=str(tile))
                if kernel == "forward":
                    measure(row, 0.2, 20, fused, inp, False, configs)
                else:
                    measure(row, 0.2, 20, _single_grad_runner, inp, configs, inp.k if kernel == "grad_q" else inp.q)
                results.append(asdict(row))
                print(f"  sweep d={d} {kernel:8s} {tile}: {row.time_ms or float('nan'):.3f} ms {row.status}",
                      flush=True)
        del inp
        _free()
    return results


def asdict_shallow(configs: KernelConfigs) -> dict:
    return {"forward": configs.forward, "grad_q": configs.grad_q, "grad_k": configs.grad_k}


def _single_grad_runner(inp: Inputs, configs: KernelConfigs, frozen: torch.Tensor) -> Callable[[], None]:
    """Forward + one backward kernel: the other input does not require grad."""
    q = inp.q.detach().requires_grad_(frozen is not inp.q)
    k = inp.k.detach().requires_grad_(frozen is not inp.k)
    wrt = q if q.requires_grad else k

    def run() -> None:
        lse_all, lse_match = ck.copy_lse_fused(q, k, inp.labels, configs=configs)
        torch.autograd.grad((lse_all, lse_match), (wrt,), (inp.g_all, inp.g_match))

    return run


# ---- report ----

def ratios(rows: list[Row]) -> dict[str, object]:
    """fused/SDPA (fwd+bwd), bf16/FP8 speed-up (forward on pre-quantized q/k; forward+backward with the
    quantization), fused extra memory as % of naive at the largest T (32k on GPUs), chunked/naive."""
    out: dict[str, object] = {}
    for row in rows:
        if row.impl != "fused" or row.dtype != "bf16" or row.status != "ok":
            continue
        fp8 = ok_row(rows, impl="fused", dtype="fp8", T=row.T, d=row.d, mode=row.mode)
        if row.mode == "fwd+bwd":
            references = {"fused_over_sdpa_fwd_bwd": ok_row(rows, impl="sdpa-flash", T=row.T, d=row.d, mode="fwd+bwd"),
                          "fp8_fwd_bwd_speedup_over_bf16": fp8}
        else:
            references = {"fp8_fwd_speedup_over_bf16": fp8}
        for name, reference in references.items():
            if reference:
                out[f"{name}[T={row.T},d={row.d}]"] = ratio(row.time_ms, reference.time_ms, 3)
    memory_t = max((r.T for r in rows if r.impl == "fused"), default=MEMORY_TARGET_T)  # 32k in the GPU run
    for row in rows:
        if (row.impl, row.dtype, row.mode, row.T) == ("fused", "bf16", "fwd+bwd", memory_t) and row.status == "ok":
            naive_row = ok_row(rows, impl="naive", T=row.T, d=row.d, mode="fwd+bwd")
            if naive_row and naive_row.extra_mem_bytes:
                base, how = naive_row.extra_mem_bytes, "measured naive peak"
            else:
                base, how = naive_scores_bytes(row.T), "naive did not run: one fp32 [b,H,T,T] tensor (lower bound)"
            out[f"fused_extra_mem_pct_of_naive[T={row.T},d={row.d}]"] = {
                "pct": round(100.0 * row.extra_mem_bytes / base, 4), "naive_bytes": base, "basis": how}
    for row in rows:  # the torch paths side by side (the CPU run's comparison; on GPU too)
        if row.impl != "chunked" or row.status != "ok":
            continue
        naive_row = ok_row(rows, impl="naive", dtype=row.dtype, T=row.T, d=row.d, mode=row.mode)
        if naive_row:
            key = f"{row.mode},T={row.T},d={row.d}"
            out[f"chunked_over_naive_time[{key}]"] = ratio(row.time_ms, naive_row.time_ms, 3)
            memory = ratio(row.extra_mem_bytes, naive_row.extra_mem_bytes, 4)
            if memory is not None:
                out[f"chunked_over_naive_extra_mem[{key}]"] = memory
    return out


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_row(row: Row) -> str:
    t = f"{row.time_ms:10.3f}" if row.time_ms is not None else f"{'-':>10s}"
    return (f"{row.impl:20s} {row.dtype:5s} {row.mode:8s} T={row.T:6d} d={row.d:4d} {t} ms "
            f"{_fmt_bytes(row.extra_mem_bytes):>11s}  {row.status}{'  (' + row.note + ')' if row.note else ''}")


def environment() -> dict[str, object]:
    info: dict[str, object] = {"python": platform.python_version(), "torch": torch.__version__,
                               "device": torch.cuda.get_device_name() if HAS_CUDA else "cpu",
                               "heads": HEADS, "batch": BATCH, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Copy-Paste score kernels: time and memory")
    parser.add_argument("--json", type=str, default=None, help="write all rows and ratios to this file")
    parser.add_argument("--quick", action="store_true", help="smallest sizes only (CPU smoke run: < 1 min)")
    parser.add_argument("--sweep-tiles", action="store_true", help="GPU: also time alternative tile configs")
    parser.add_argument("--seq-lens", type=int, nargs="+", help="sequence lengths T (replace the default set)")
    parser.add_argument("--head-dims", type=int, nargs="+", help="head dims d_c (replace the default set)")
    parser.add_argument("--d128-seq-lens", type=int, nargs="*", default=None,
                        help="GPU table: also d_c=128 at these T (default 8192 16384 on a GPU, 32 for --gpu-row-set; "
                             "no values: none)")
    parser.add_argument("--gpu-row-set", action="store_true",
                        help="on CPU, run the GPU table's rows (bf16, SDPA flash, fused + FP8 interpreted): a dry run")
    args = parser.parse_args(argv)

    d128 = None if args.d128_seq_lens is None else tuple(args.d128_seq_lens)
    plan = make_plan(args.quick, tuple(args.seq_lens or ()), tuple(args.head_dims or ()), d128, args.gpu_row_set)
    env = environment()
    print(f"# copy kernel benchmark on {env['device']} (torch {env['torch']}, triton {env['triton']}); "
          f"b={BATCH}, H_c={HEADS}; extra memory = peak during the call beyond the inputs", flush=True)
    started = time.perf_counter()

    done: list[Row] = []

    def log(row: Row) -> Row:  # every row is written as it is measured: a killed run keeps the rows so far
        print(format_row(row), flush=True)
        done.append(row)
        try:
            partial_ratios = ratios(done)
        except Exception as err:  # noqa: BLE001 -- the rows matter more than ratios over a partial table
            partial_ratios = {"error": f"{type(err).__name__}: {err}"}
        write_partial(args.json, {"environment": env, "rows": [asdict(r) for r in done], "ratios": partial_ratios,
                                  "tile_sweep": []})
        return row

    rows = gpu_rows(plan, log) if HAS_CUDA or args.gpu_row_set else cpu_rows(plan, log)
    summary = ratios(rows)
    print("\n# ratios" + (" (targets: fused/SDPA <= 1.5 (1.2 the aim), FP8 speed-up over bf16 >= 1.2 at d_c=128, "
                           "extra memory <= 1% of naive)"
                           if HAS_CUDA else " (CPU: the torch paths; the fused kernel's speed is measured on GPUs)"))
    for key, value in summary.items():
        print(f"{key}: {value}")
    if HAS_CUDA:
        summary["naive_scores_bytes_theoretical"] = {T: naive_scores_bytes(T) for T in plan.seq_lens}
    sweep = sweep_tiles(plan.head_dims) if (args.sweep_tiles and HAS_CUDA) else []
    elapsed = time.perf_counter() - started
    print(f"# done in {elapsed:.1f} s", flush=True)
    if args.json:
        write_partial(args.json, {"environment": env, "rows": [asdict(r) for r in rows], "ratios": summary,
                                  "tile_sweep": sweep, "elapsed_s": round(elapsed, 1)}, complete=True)
        print(f"# wrote {args.json}")
    return 0 if all(not r.status.startswith("failed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
