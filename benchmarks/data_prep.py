#!/usr/bin/env python
"""Data-preparation throughput per CPU core on the embedded corpus: what tokenizing 100B tokens costs.

Stages of `tools/prepare_data.py`, each timed on its own over the embedded corpus's training split (the
Python standard library sources of data/stdlib, with its byte-level BPE), in one process and one thread:

* ``read``: the input files read and decoded into documents (`DocumentReader`);
* ``read_jsonl_zst``: the same documents read back from zstd-compressed JSON lines (how large corpora ship),
  written to a scratch directory first (~1 MB of text per file);
* ``tokenize``: the documents tokenized (the Rust tokenizer the workers run, `tokenize_documents`, one worker);
* ``write``: the token ids packed into samples and written as zstd MDS shards with xxh3 hashes
  (`write_packed_samples`);
* ``prepare``: the whole `prepare_dataset(..., workers=1)` from files to a finished dataset, as one
  `--part` of a SLURM array runs it (tokenizer load, reading, tokenizing, writing, manifest).

Rates are tokens per CPU-second of this process (`time.process_time`: a busy machine stretches wall time,
not CPU time), i.e. tokens per second per core; wall-clock rates are kept beside them. `prepare_data.py
--workers W` runs W such tokenizer processes beside one writer, so a task's rate grows with its cores until
the writer (``write``) is the bottleneck. Core-hours for 100B tokens = 1e11 / rate / 3600. Median of --reps.
Run it pinned to one core: ``taskset -c 0 python -m benchmarks.data_prep --json results/data_prep_cpu.json``.

    python -m benchmarks.data_prep --json OUT.json [--reps N] [--max-bytes B] [--corpus DIR]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: a per-core figure
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from benchmarks.partial_results import write_partial  # noqa: E402
from cplm_megatron.data.documents import DocumentReader  # noqa: E402
from cplm_megatron.data.manifest import read_manifest  # noqa: E402
from cplm_megatron.data.parallel_tokenize import tokenize_documents  # noqa: E402
from cplm_megatron.data.prepare import prepare_dataset  # noqa: E402
from cplm_megatron.data.shards import write_packed_samples  # noqa: E402
from cplm_megatron.data.tokenizer import backend_json, describe_tokenizer, load_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOKENS_100B = 100e9


def timed(fn):
    """(result, cpu seconds, wall seconds) of fn()."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.process_time() - cpu, time.perf_counter() - wall


def corpus_files(corpus: Path, max_bytes: int | None) -> list[Path]:
    files, total = [], 0
    for name in read_manifest(str(corpus / "train")).source_files:
        path = Path(name)
        if not path.is_file():
            continue
        if max_bytes is not None and total + path.stat().st_size > max_bytes:
            break
        files.append(path)
        total += path.stat().st_size
    if not files:
        raise SystemExit(f"error: no source files of {corpus}/train/manifest.json exist on this machine; "
                         f"build the corpus here first (python tools/build_stdlib_corpus.py)")
    return files


def measure(files: list[Path], tokenizer_dir: Path, seq_len: int, scratch: Path) -> dict[str, dict[str, float]]:
    """One repetition of every stage: {stage: {cpu_s, wall_s, tokens, ...}}."""
    out: dict[str, dict[str, float]] = {}
    docs, cpu, wall = timed(lambda: list(DocumentReader(files)))
    text_bytes = sum(len(d.encode("utf-8")) for d in docs)
    tokenizer = load_tokenizer(tokenizer_dir)
    info = describe_tokenizer(tokenizer_dir, tokenizer)
    tokenizer_json = backend_json(tokenizer, tokenizer_dir)
    token_docs, tcpu, twall = timed(lambda: list(tokenize_documents(docs, tokenizer_json, workers=1)))
    tokens = sum(len(t) + 1 for t in token_docs)  # + one EOD each, as the dataset counts them
    out["read"] = {"cpu_s": cpu, "wall_s": wall, "tokens": tokens, "bytes": text_bytes}
    jsonl = _write_jsonl_zst(docs, scratch / "jsonl")
    _, jcpu, jwall = timed(lambda: sum(1 for _ in DocumentReader(jsonl)))
    out["read_jsonl_zst"] = {"cpu_s": jcpu, "wall_s": jwall, "tokens": tokens, "bytes": text_bytes}
    shutil.rmtree(scratch / "jsonl")
    out["tokenize"] = {"cpu_s": tcpu, "wall_s": twall, "tokens": tokens, "bytes": text_bytes}
    shards = scratch / "shards"
    packer, wcpu, wwall = timed(lambda: write_packed_samples(token_docs, shards, seq_len, info, "64mb"))
    out["write"] = {"cpu_s": wcpu, "wall_s": wwall, "tokens": packer.tokens,
                    "shard_bytes": sum(p.stat().st_size for p in shards.glob("shard.*"))}
    shutil.rmtree(shards)
    result, pcpu, pwall = timed(lambda: prepare_dataset(files, tokenizer_dir, scratch / "ds", seq_len=seq_len,
                                                        workers=1, show_progress=False))
    out["prepare"] = {"cpu_s": pcpu, "wall_s": pwall, "tokens": result.manifest.tokens, "bytes": text_bytes}
    shutil.rmtree(scratch / "ds")
    return out


def _write_jsonl_zst(docs: list[str], directory: Path, chunk_bytes: int = 1 << 20) -> list[Path]:
    import json

    import zstd

    directory.mkdir(parents=True)
    files, lines, size = [], [], 0

    def flush() -> None:
        path = directory / f"part-{len(files):04d}.jsonl.zst"
        path.write_bytes(zstd.compress("".join(lines).encode("utf-8"), 3))
        files.append(path)

    for doc in docs:
        lines.append(json.dumps({"text": doc}) + "\n")
        size += len(doc)
        if size >= chunk_bytes:
            flush()
            lines, size = [], 0
    if lines:
        flush()
    return files


def summarize(reps: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    stages = {}
    for stage in reps[0]:
        tokens = reps[0][stage]["tokens"]
        cpu = statistics.median(r[stage]["cpu_s"] for r in reps)
        wall = statistics.median(r[stage]["wall_s"] for r in reps)
        rate = tokens / cpu
        stages[stage] = {
            "tokens": tokens,
            "cpu_s_median": round(cpu, 4),
            "wall_s_median": round(wall, 4),
            "cpu_s_all": [round(r[stage]["cpu_s"], 4) for r in reps],
            "tokens_per_core_s": round(rate, 1),
            "tokens_per_wall_s": round(tokens / wall, 1),
            "core_hours_per_100b_tokens": round(TOKENS_100B / rate / 3600, 1),
        }
        if "bytes" in reps[0][stage]:
            stages[stage]["mb_per_core_s"] = round(reps[0][stage]["bytes"] / cpu / 1e6, 3)
    return stages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--corpus", default=str(REPO / "data" / "stdlib"), help="a built embedded corpus")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (median)")
    parser.add_argument("--max-bytes", type=int, help="use only the first B bytes of source files (smoke runs)")
    args = parser.parse_args(argv)
    corpus = Path(args.corpus)
    files = corpus_files(corpus, args.max_bytes)
    seq_len = read_manifest(str(corpus / "train")).seq_len
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    environment = {
        "python": platform.python_version(), "machine": platform.machine(), "cpu": _cpu_model(),
        "cpus_allowed": affinity, "threads": 1, "clock": "process (CPU seconds of this process)",
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "corpus": "embedded stdlib corpus, train split",
        "files": len(files), "seq_len": seq_len, "reps": args.reps,
    }
    if len(affinity) != 1:
        print(f"note: this process may run on {len(affinity)} cores; pin it (taskset -c 0) for a per-core figure",
              file=sys.stderr)
    reps = []
    with tempfile.TemporaryDirectory(prefix="data-prep-bench-") as tmp:
        for rep in range(args.reps):
            reps.append(measure(files, corpus / "tokenizer", seq_len, Path(tmp)))
            write_partial(args.json, {"environment": environment, "stages": summarize(reps)},
                          complete=rep == args.reps - 1)
    stages = summarize(reps)
    for name, s in stages.items():
        print(f"{name:14s} {s['tokens']:>10,} tokens  {s['tokens_per_core_s']:>11,.0f} tokens/core-s  "
              f"{s['core_hours_per_100b_tokens']:>9,.1f} core-h per 100B tokens")
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
