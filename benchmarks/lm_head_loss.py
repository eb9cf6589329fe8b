"""LM head + loss, forward+backward: Megatron's path vs `model.lm_head_loss: chunked | fused`.

Megatron's path is megatron-core's own: the GPT output layer (``ColumnParallelLinear``, no bias) and
``vocab_parallel_cross_entropy``. Ours is :func:`cplm_megatron.model.lm_head_loss.lm_head_ce`. Each
call runs the forward on hidden states ``[s, 1, h]`` and labels ``[1, s]``, then the backward with
a random per-token upstream gradient (as the copy mixture gives), returning the gradients of the
hidden states and the output weight. Sizes: SmolLM2 widths 576 and 2048, vocabulary 49152,
sequence 2048 and 8192, micro-batch 1, TP=1 (fp32 on CPU, bf16 on GPU).

Memory per call (MemTracker on CPU, which follows every tensor storage; the CUDA allocator on GPU),
beyond the inputs (hidden states, weight, labels, upstream gradient):
* ``peak``: the peak during forward+backward;
* ``working``: ``peak`` minus the two gradients every implementation returns (``[s, h]`` and
  ``[V, h]``): the memory the loss path needs on top of its inputs and outputs ("extra memory");
* ``saved``: what the forward leaves alive for the backward (activations held across the model's
  backward), minus the returned loss.
Times: median of interleaved repetitions (A, B, A, B, ...) after one warm-up each. Values and
gradients of every implementation are compared with Megatron's (max relative error).

    python -m benchmarks.lm_head_loss --json OUT.json [--quick] [--reps N] [--chunks TOKENSxVOCAB[v]]

``--quick``: tiny sizes, 2 repetitions (CPU smoke run). On CPU ``fused`` runs in the Triton
interpreter at a tiny size only (correctness path, not a speed measurement), and the full run also
times ``chunked`` with a token-major tile (``chunked@1024x2048``) next to the default vocab-major one.
Tiles: ``TOKENSxVOCAB`` token-major, ``TOKENSxVOCABv`` vocab-major.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton loads: `fused` runs interpreted on CPU

from benchmarks.common import memory_probe, rel_err  # noqa: E402
from benchmarks.common import sync as _sync  # noqa: E402
from benchmarks.partial_results import write_partial  # noqa: E402
from benchmarks.ratios import ok_row, ratio  # noqa: E402
from cplm_kernels.linear_ce import CEChunks  # noqa: E402

VOCAB = 49152
FULL_SIZES = [(576, 2048), (576, 8192), (2048, 2048), (2048, 8192)]  # (hidden, seq)
QUICK_SIZES = [(64, 512), (64, 2048)]
QUICK_VOCAB = 4096
INTERPRETER_SIZE = (32, 64, 512)  # hidden, seq, vocab: the interpreter costs ~ms per program (one per row)


@dataclass
class Row:
    impl: str
    hidden: int
    seq: int
    vocab: int
    dtype: str
    time_s: Optional[float] = None
    peak_bytes: Optional[int] = None
    working_bytes: Optional[int] = None
    saved_bytes: Optional[int] = None
    max_rel_err: Optional[Dict[str, float]] = None
    status: str = "ok"
    note: str = ""


@dataclass
class Case:
    """One size: the output layer, inputs and upstream gradient."""

    layer: torch.nn.Module
    hidden: torch.Tensor
    labels: torch.Tensor
    grad: torch.Tensor

    @property
    def inputs(self) -> List[torch.Tensor]:
        return [self.hidden, self.layer.weight, self.labels, self.grad]


def init_megatron() -> None:
    """One-process torch.distributed + Megatron parallel state (TP=PP=1)."""
    from cplm_megatron.model.config import ModelConfig
    from cplm_megatron.model.layout import init_distributed
    from cplm_megatron.parallel.distributed import ParallelConfig
    from cplm_megatron.parallel.megatron_patches import setup_compat

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from cplm_megatron.parallel.distributed import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    setup_compat()
    init_distributed(ParallelConfig(), ModelConfig(), seed=1)


def make_case(hidden: int, seq: int, vocab: int, dtype: torch.dtype) -> Case:
    from megatron.core import tensor_parallel
    from megatron.core.transformer import TransformerConfig

    device = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=1, params_dtype=dtype,
                               use_cpu_initialization=not HAS_CUDA, bf16=dtype == torch.bfloat16,
                               init_method_std=0.02)
    layer = tensor_parallel.ColumnParallelLinear(hidden, vocab, config=config, init_method=config.init_method,
                                                 bias=False, gather_output=False).to(device)
    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(seq, 1, hidden, generator=g, device=device).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (1, seq), generator=g, device=device)
    grad = torch.rand(1, seq, generator=g, device=device)
    return Case(layer, h, labels, grad)


def runner(case: Case, impl: str, chunks: Optional[CEChunks]) -> Callable[[], Tuple[torch.Tensor, ...]]:
    from cplm_megatron.model.lm_head_loss import lm_head_ce

    def run(on_forward: Optional[Callable[[torch.Tensor], None]] = None):
        case.hidden.grad = case.layer.weight.grad = None
        loss = lm_head_ce(case.hidden, case.layer, case.labels, impl, chunks=chunks)
        if on_forward is not None:
            on_forward(loss)
        loss.backward(case.grad)  # (MemTracker does not follow torch.autograd.grad on leaves)
        d_hidden, d_weight = case.hidden.grad, case.layer.weight.grad
        case.hidden.grad = case.layer.weight.grad = None
        return loss.detach(), d_hidden, d_weight

    return run


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_memory(run: Callable, case: Case) -> Tuple[int, int, int, Tuple[torch.Tensor, ...]]:
    """(peak, working, saved) bytes beyond the inputs, and the call's outputs."""
    marks: Dict[str, int] = {}
    with memory_probe([case.layer, *case.inputs]) as probe:
        def after_forward(loss):
            marks["saved"] = probe.current() - _nbytes(loss)

        out = run(after_forward)
    peak = probe.peak
    return peak, peak - _nbytes(out[1], out[2]), marks["saved"], out


Variant = Tuple[str, str, Optional[CEChunks]]  # (label, model.lm_head_loss, tile or None for the default)


def bench_size(hidden: int, seq: int, vocab: int, dtype: torch.dtype, variants: List[Variant], reps: int,
               note: str = "", clock: Callable[[], float] = time.perf_counter) -> List[Row]:
    """Memory, errors vs Megatron and interleaved times of ``variants`` (the first is Megatron's path)."""
    case = make_case(hidden, seq, vocab, dtype)
    dname = str(dtype).replace("torch.", "")
    impls = [label for label, _, _ in variants]
    rows = {label: Row(label, hidden, seq, vocab, dname, note=note) for label in impls}
    runs = {label: runner(case, impl, chunks) for label, impl, chunks in variants}
    reference = None
    for impl in impls:
        row = rows[impl]
        try:
            row.peak_bytes, row.working_bytes, row.saved_bytes, out = measure_memory(runs[impl], case)
            if reference is None:
                reference = out
            else:
                row.max_rel_err = {name: rel_err(a, b) for name, a, b in
                                   zip(("loss", "d_hidden", "d_weight"), out, reference)}
            del out
        except torch.OutOfMemoryError:
            row.status = "skipped: OOM"
        except Exception as err:  # noqa: BLE001 -- one failing variant must not lose the others
            row.status = f"failed: {type(err).__name__}: {err}"[:500]
        gc.collect()
        if HAS_CUDA:
            torch.cuda.empty_cache()
    reference = None
    live = [impl for impl in impls if rows[impl].status == "ok"]
    times: Dict[str, List[float]] = {impl: [] for impl in live}
    for rep in range(reps + 1):  # the first round warms up (and compiles kernels)
        for impl in list(live):
            try:
                _sync()
                start = clock()
                runs[impl]()
                _sync()
            except Exception as err:  # noqa: BLE001 -- OOM or a kernel error while timing: keep the others
                rows[impl].status = f"failed while timing: {type(err).__name__}: {err}"[:500]
                live.remove(impl)
                continue
            if rep:
                times[impl].append(clock() - start)
    for impl in live:
        rows[impl].time_s = statistics.median(times[impl])
    del case, runs
    gc.collect()
    if HAS_CUDA:
        torch.cuda.empty_cache()
    return list(rows.values())


def ratios(rows: List[Row]) -> Dict[str, Dict[str, float]]:
    """Per size and implementation: working, peak and saved memory and time relative to Megatron's path."""
    out: Dict[str, Dict[str, float]] = {}
    for r in rows:
        if r.impl == "megatron" or r.status != "ok" or "interpreter" in r.note:
            continue
        ref = ok_row(rows, impl="megatron", hidden=r.hidden, seq=r.seq, vocab=r.vocab, dtype=r.dtype)
        if ref is None:
            continue
        out[f"{r.impl}[h={r.hidden},seq={r.seq},V={r.vocab},{r.dtype}]"] = {
            "memory_ratio": ratio(r.working_bytes, ref.working_bytes, 4),
            "peak_ratio": ratio(r.peak_bytes, ref.peak_bytes, 4),
            "saved_ratio": ratio(r.saved_bytes, max(ref.saved_bytes, 1), 6),
            "time_ratio": ratio(r.time_s, ref.time_s, 3),
        }
    return out


def _mib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / 2**20:9.1f}"


def format_row(r: Row) -> str:
    t = "-" if r.time_s is None else f"{r.time_s:8.3f}"
    err = "" if not r.max_rel_err else " err " + " ".join(f"{k}={v:.1e}" for k, v in r.max_rel_err.items())
    return (f"{r.impl:17s} h={r.hidden:5d} seq={r.seq:5d} V={r.vocab:6d} {r.dtype:8s} {t:>8s} s  working "
            f"{_mib(r.working_bytes)} MiB  peak {_mib(r.peak_bytes)} MiB  saved {_mib(r.saved_bytes)} MiB"
            f"{err}  {r.status}{'  (' + r.note + ')' if r.note else ''}")


def parse_chunks(text: Optional[str]) -> Optional[CEChunks]:
    """'1024x2048' (token-major) or '1024x2048v' (vocab-major)."""
    if not text:
        return None
    text = text.lower()
    tokens, _, vocab = text.rstrip("v").partition("x")
    return CEChunks(int(tokens), int(vocab), vocab_major=text.endswith("v"))


def variants_for(quick: bool, chunks: Optional[CEChunks]) -> List[Variant]:
    """Megatron's path, ``chunked`` (and ``fused`` on GPUs) with the default tile or ``chunks``; the full
    CPU run adds a token-major ``chunked`` tile to compare with the default vocab-major one."""
    out: List[Variant] = [("megatron", "megatron", None), ("chunked", "chunked", chunks)]
    if HAS_CUDA:
        out.append(("fused", "fused", chunks))
    elif not quick and chunks is None:
        out.append(("chunked@1024x2048", "chunked", CEChunks(1024, 2048)))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write rows and ratios to this file")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunks", help="tile TOKENSxVOCAB (token-major) or TOKENSxVOCABv (vocab-major); "
                   "default: cplm_kernels.linear_ce.default_chunks")
    p.add_argument("--sizes", nargs="+", help="HIDDENxSEQ pairs instead of the default grid")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="process: CPU seconds of this process (steadier on a shared CPU with OMP_NUM_THREADS=1)")
    args = p.parse_args(argv)
    try:
        chunks = parse_chunks(args.chunks)
        sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.sizes] if args.sizes else None
    except ValueError as err:
        print(f"error: --chunks/--sizes: {err}", file=sys.stderr)
        return 2
    from cplm_megatron.entry_points import quiet_known_warnings

    quiet_known_warnings()
    init_megatron()
    import cplm_kernels

    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    vocab = QUICK_VOCAB if args.quick else VOCAB
    sizes = sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    reps = 2 if args.quick else args.reps
    variants = variants_for(args.quick, chunks)
    rows: List[Row] = []
    clock = time.process_time if args.clock == "process" else time.perf_counter
    environment = {"python": platform.python_version(), "torch": torch.__version__,
                   "device": torch.cuda.get_device_name() if HAS_CUDA else "cpu",
                   "threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "chunks": asdict(chunks) if chunks else "default", "clock": args.clock}

    def write(complete: bool) -> None:  # after every size: a killed run keeps the sizes measured so far
        write_partial(args.json, {"environment": environment, "rows": [asdict(r) for r in rows],
                                  "ratios": ratios(rows)}, complete)

    plan = [(hidden, seq, vocab, dtype, variants, reps, "") for hidden, seq in sizes]
    if not HAS_CUDA and cplm_kernels.fused_available():
        h, s, v = INTERPRETER_SIZE
        note = "Triton CPU interpreter: correctness path, NOT a speed measurement"
        plan.append((h, s, v, torch.float32, [("megatron", "megatron", None), ("fused", "fused", CEChunks(32, 128))],
                     1, note))
    for hidden, seq, v, dt, variant_set, n, note in plan:
        try:
            measured = bench_size(hidden, seq, v, dt, variant_set, n, note, clock=clock)
        except Exception as err:  # noqa: BLE001 -- e.g. OOM building the case: the next size still runs
            measured = [Row(label, hidden, seq, v, str(dt).replace("torch.", ""), note=note,
                            status=f"failed: {type(err).__name__}: {err}"[:500]) for label, _, _ in variant_set]
        for row in measured:
            rows.append(row)
            print(format_row(row), flush=True)
        write(complete=False)
    summary = ratios(rows)
    for key, value in summary.items():
        print(f"{key}: memory x{value['memory_ratio']} (peak x{value['peak_ratio']}, saved x{value['saved_ratio']}), "
              f"time x{value['time_ratio']}")
    write(complete=True)
    return 0 if all(r.status == "ok" or r.status.startswith("skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
