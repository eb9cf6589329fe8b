"""The GPU check's `study` step: where in-context copying emerges, baseline against the recipe's CPLM, both trained for
the same tokens (set by a time budget) on the code corpus of this machine's own installed Python sources, probed
every N steps, and scored beside their controls.

    python benchmarks/gpu/study_step.py WORK_DIR [--tiny] [--budget SECONDS]

Run from the check's scratch tree (benchmarks/, pretrain/, configs/) with the project, megatron-core and the carried
wheels (mosaicml-streaming and its compiled needs) installed. One process; WORK_DIR/study.json is rewritten as each
phase ends (a budget cut keeps what finished). Phases, within `--budget` seconds from the start:

1. corpus: cplm_megatron.data.code_corpus over this interpreter's standard library and site-packages with the
   corpus's own split rules (the GPU's: whatever the package set, the split adapts and split.json says how; held-out
   files written one package at a time in turn, so the scored validation samples span the packages).
2. train, the CPLM first: a 4-layer, 256-wide Llama (SIZES.model) sized so each arm trains ~1e8 tokens in its share
   of the budget on an H200 (`estimated_tokens_per_sec`; measured on the next lease): the time left after the corpus,
   less what scoring needs, split in two. The CPLM trains until its share is spent (a SIGUSR1 from a timer: the
   trainer's graceful stop, a checkpoint at the next step) or its iteration cap; the baseline then trains exactly as
   many iterations (`train.exit_after_iters`) on the same schedule (warm-up, then constant), data order and seed.
   Both log `probe_copy_accuracy` and `probe_in_context_score` every `probe_interval` steps (train.probe_interval:
   the step where copying emerges; the validation loader the in-context score reads is built by
   train.eval_interval, set to the iteration cap).
3. score_val: both arms' validation loss and the baseline + continuous cache control (lambda/theta tuned on the dev
   split), CPLM - baseline and CPLM - (baseline + cache) paired over the same documents: before anything else.
4. score_tasks: the copy task beside chance and the one-token-match copier, the passkey task beside chance.

--tiny: the CPU dry run's sizes (a 2-layer, 64-wide model, a 4 MB corpus with the same split rules, a 25 s share
per arm): it checks the step, not a result. Exit 0 when every phase finished, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

RECIPE = "configs/smollm2_135m.yaml"
ARMS = ("cplm", "baseline")  # training order: the CPLM (the slower arm) sets the tokens both train
TARGET_TOKENS = 100_000_000  # per arm: copying circuits appear after ~1e8 tokens
# The throughput model behind the shape (seconds per token = layers x a + training FLOPs per token / R), fitted to two
# runs measured on one H200 on 2026-12-04 (results/gpu/2026-12-04, bf16, SDPA, Megatron's LM-head loss):
# SmolLM2-135M at seq 2048, micro-batch 8: 128.5k tokens/s; SmolLM2-1.7B at seq 4096, 16 sequences per step: 37.4k.
MEASURED = (("smollm2-135m", 2048, 128_500.0), ("smollm2-1.7b", 4096, 37_400.0))


@dataclass(frozen=True)
class Sizes:
    """How big each phase is."""

    model: Dict[str, Any]  # overrides of the tiny preset (model.*)
    corpus_bytes: int
    vocab_size: int
    seq_len: int
    tokenizer_sample_bytes: int
    micro_batch: int
    global_batch: int
    max_iters: int  # the iteration cap of an arm (its time share normally ends it first on a GPU)
    max_arm_seconds: float  # an arm's time share at most
    warmup_iters: int
    lr: float
    probe_interval: int
    probe_sequences: int
    probe_copy_length: int
    probe_val_batches: int  # validation micro-batches of the in-context score
    score_reserve_s: float  # kept for scoring (and the arms' start-up) out of the budget
    eval_batch: int
    val_sequences: int  # validation samples scored (spread across the set; dev samples the cache is tuned on)
    copy_sequences: int
    copy_length: int
    passkey_per_cell: int
    passkey_lengths: tuple
    passkey_depths: tuple = (0.0, 0.5, 1.0)
    budget_s: float = 200.0  # the step's seconds (--budget overrides)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


STUDY_MODEL = {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 768, "num_attention_heads": 4,
               "num_query_groups": 2}
GPU = Sizes(model=STUDY_MODEL, corpus_bytes=60_000_000, vocab_size=8192, seq_len=1024,
            tokenizer_sample_bytes=24_000_000, micro_batch=64, global_batch=64, max_iters=6000, max_arm_seconds=90,
            warmup_iters=30, lr=2e-3, probe_interval=100, probe_sequences=32, probe_copy_length=256,
            probe_val_batches=2, score_reserve_s=45, eval_batch=32, val_sequences=256, copy_sequences=64,
            copy_length=512, passkey_per_cell=16, passkey_lengths=(256, 1024))
TINY = Sizes(model={"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 192, "num_attention_heads": 2,
                    "num_query_groups": 1},
             corpus_bytes=4_000_000, vocab_size=512, seq_len=128, tokenizer_sample_bytes=400_000, micro_batch=4,
             global_batch=4, max_iters=400, max_arm_seconds=25, warmup_iters=2, lr=1e-3, probe_interval=5,
             probe_sequences=4, probe_copy_length=32, probe_val_batches=1, score_reserve_s=60, eval_batch=4,
             val_sequences=16, copy_sequences=4, copy_length=64, passkey_per_cell=2, passkey_lengths=(64, 128),
             passkey_depths=(0.0, 1.0), budget_s=2000)


def study_model(sizes: Sizes, vocab: int, seq_len: int):
    """The ModelConfig both arms train (the tiny preset with SIZES.model)."""
    from dataclasses import replace

    from cplm_megatron.model.config import load_preset

    return replace(load_preset("tiny"), **sizes.model, vocab_size=vocab, max_position_embeddings=seq_len)


def throughput_fit() -> Tuple[float, float]:
    """(a, R) of seconds per token = layers x a + training FLOPs per token / R, solved from the two MEASURED runs."""
    from dataclasses import replace

    from cplm_megatron.model.config import load_preset
    from cplm_megatron.model.sizing.accounting import train_flops_per_token

    rows = []
    for preset, seq, tokens_per_sec in MEASURED:
        model = replace(load_preset(preset), max_position_embeddings=max(seq, 2048))
        rows.append((model.num_layers, train_flops_per_token(model, seq, None), 1 / tokens_per_sec))
    (l1, f1, t1), (l2, f2, t2) = rows
    inverse_rate = (t2 - t1 * l2 / l1) / (f2 - f1 * l2 / l1)
    return (t1 - f1 * inverse_rate) / l1, 1 / inverse_rate


def estimated_tokens_per_sec(model, copy, seq_len: int) -> float:
    """The H200 tokens/s of a model by the fit (`throughput_fit`): an estimate, to be measured."""
    from cplm_megatron.model.sizing.accounting import train_flops_per_token

    a, rate = throughput_fit()
    return 1 / (model.num_layers * a + train_flops_per_token(model, seq_len, copy) / rate)


class Record:
    """WORK_DIR/study.json, rewritten (through a temporary and a rename) after every phase."""

    def __init__(self, work: Path, sizes: Sizes, tiny: bool, budget: float):
        self.path = work / "study.json"
        self.data: Dict[str, Any] = {
            "dry_run": tiny, "complete": False, "budget_s": budget, "sizes": asdict(sizes), "estimate": None,
            "phases": {}, "corpus": None, "arms": {}, "equal_tokens": None, "controls": {}, "comparisons": {},
            "note": ("val_loss: mean NLL of the model's full distribution (the mixture for the CPLM) on val_sequences "
                     "samples spread across the validation split; probes: probe_copy_accuracy (the copy task's "
                     "repeats, beside 1/(V-1)) and probe_in_context_score (NLL at context positions [T/2, T) minus "
                     "[T/16, T/8) on the validation batches; negative: the model uses its context) every "
                     "probe_interval steps from step 0; controls: the baseline + continuous cache (Grave et al. "
                     "2017; lambda/theta tuned on the dev split), copy chance and the one-token-match copier, "
                     "passkey chance; comparisons: paired over the same validation documents, 95% document "
                     "bootstrap")}
        self.write()

    def phase(self, name: str, seconds: float, ok: bool, error: Optional[str] = None) -> None:
        self.data["phases"][name] = {"seconds": round(seconds, 1), "ok": ok, **({"error": error} if error else {})}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(self.path)


def run_phase(record: Record, name: str, body: Callable[[], None]) -> bool:
    """Time `body`, record it (an exception is the phase's error, not the script's end)."""
    start = time.perf_counter()
    print(f"[study] {name}: start", flush=True)
    try:
        body()
    except Exception as err:  # noqa: BLE001 - one phase's failure is recorded; later phases may still run
        import traceback

        traceback.print_exc()
        record.phase(name, time.perf_counter() - start, False, f"{type(err).__name__}: {err}")
        print(f"[study] {name}: failed: {type(err).__name__}: {err}", flush=True)
        return False
    record.phase(name, time.perf_counter() - start, True)
    print(f"[study] {name}: done in {time.perf_counter() - start:.1f} s", flush=True)
    return True


def build_corpus(work: Path, sizes: Sizes, record: Record) -> Path:
    """The code corpus of this machine's installed sources (the split rules are the corpus's defaults) -> WORK/runs/
    code (the shards stay out of the check's tarball; its split.json is copied to WORK/study_split.json)."""
    import shutil

    from cplm_megatron.data.code_corpus import SPLIT_RECORD, CodeCorpusSettings, build_code_corpus

    settings = CodeCorpusSettings(vocab_size=sizes.vocab_size, seq_len=sizes.seq_len,
                                  tokenizer_sample_bytes=sizes.tokenizer_sample_bytes)
    corpus = build_code_corpus(work / "runs" / "code", settings, max_bytes=sizes.corpus_bytes, show_progress=False)
    shutil.copy(corpus.root / SPLIT_RECORD, work / "study_split.json")
    r = corpus.record
    record.data["corpus"] = {
        "seconds": r["seconds"], "workers": r["workers"], "python": r["python"],
        "distributions": len(r["distributions"]), "source_bytes": sum(d["bytes"] for d in r["distributions"]),
        "splits": {k: {f: v[f] for f in ("distributions", "documents", "tokens", "bytes")} for k, v in r["splits"].items()},
        "split_rules": r["split_rules"], "vocab_size": r["tokenizer"]["vocab_size"],
        "val_largest_document_share": r["splits"]["val"]["largest_document_share"],
        "val_shingles_in_train": r["held_out_overlap"]["val"]["fraction_in_train"],
        "val_files_in_train": r["held_out_overlap"]["val"]["files_in_train"]}
    return corpus.root


# Shapes the study's was chosen from ((layers, width), FFN 3 x width, 64-wide heads, 2 KV groups), each estimated in
# an arm's share of the lease's 200 s study (LEASE_SHARE_S: 190 s for the step, less ~30 s for the 60 MB corpus on
# the machine's cores, less the 45 s scoring reserve, in two)
CANDIDATES = ((2, 256), (4, 256), (4, 384), (6, 256), (8, 512))
LEASE_SHARE_S = 60


def candidate_model(sizes: Sizes, vocab: int, layers: int, width: int):
    """A candidate shape as a ModelConfig (the study's model with `layers` x `width`)."""
    shape = {"num_layers": layers, "hidden_size": width, "ffn_hidden_size": 3 * width,
             "num_attention_heads": width // 64, "num_query_groups": 2}
    return study_model(replace_sizes(sizes, model=shape), vocab, sizes.seq_len)


def replace_sizes(sizes: Sizes, **changes: Any) -> Sizes:
    """`sizes` with some fields changed."""
    from dataclasses import replace

    return replace(sizes, **changes)


def estimate(sizes: Sizes, vocab: int) -> Dict[str, Any]:
    """The arms' estimated H200 tokens/s, the tokens that gives in the longest arm share, and the candidate shapes'
    baseline tokens/s and tokens in an arm's share of the lease's study."""
    from cplm_megatron.model.sizing.accounting import CopyHeadShape, train_flops_per_token

    model = study_model(sizes, vocab, sizes.seq_len)
    rates = {arm: estimated_tokens_per_sec(model, CopyHeadShape() if arm == "cplm" else None, sizes.seq_len)
             for arm in ARMS}
    a, rate = throughput_fit()
    candidates = []
    for layers, width in CANDIDATES:
        shape = candidate_model(sizes, vocab, layers, width)
        speed = estimated_tokens_per_sec(shape, None, sizes.seq_len)
        candidates.append({"layers": layers, "width": width, "study": (layers, width) == (
            sizes.model["num_layers"], sizes.model["hidden_size"]),
            "train_mflop_per_token": round(train_flops_per_token(shape, sizes.seq_len, None) / 1e6, 1),
            "tokens_per_sec_h200": round(speed), "tokens_in_lease_share": round(speed * LEASE_SHARE_S)})
    return {"model": sizes.model, "vocab_size": vocab, "seq_len": sizes.seq_len,
            "tokens_per_sec_h200": {arm: round(r) for arm, r in rates.items()},
            "tokens_in_max_arm_share": round(min(rates.values()) * sizes.max_arm_seconds),
            "lease_share_s": LEASE_SHARE_S, "candidates": candidates,
            "basis": f"seconds/token = layers x {a:.3e} + FLOPs/token / {rate:.3e} (fitted to the 2026-12-04 H200 "
                     f"runs: 135M 128.5k tokens/s, 1.7B seq 4096 37.4k); an estimate, to be measured"}


def train_overrides(arm: str, sizes: Sizes, corpus: Path, run_dir: Path, vocab: int,
                    exit_after: Optional[int] = None) -> List[str]:
    """The `--set` overrides of the recipe for one arm (the arms differ in the copy head, and the baseline stops at
    the CPLM's iteration count)."""
    model = [f"model.{k}={v}" for k, v in sizes.model.items()]
    out = [f"run.dir={run_dir}", "model.preset=tiny", *model, f"model.vocab_size={vocab}",
           f"model.max_position_embeddings={sizes.seq_len}", "model.attention_impl=sdpa", "model.lm_head_loss=auto",
           f"copy_head.enabled={'true' if arm == 'cplm' else 'false'}", f"data.streams=[{corpus / 'train'}]",
           f"data.val_streams=[{corpus / 'val'}]", "data.num_workers=2", "train.tokens=null",
           f"train.iters={sizes.max_iters}", f"train.seq_len={sizes.seq_len}", f"train.micro_batch={sizes.micro_batch}",
           f"train.global_batch={sizes.global_batch}", f"train.lr={sizes.lr}", f"train.min_lr={sizes.lr}",
           "schedule.style=constant", f"schedule.warmup_iters={sizes.warmup_iters}", "train.log_interval=10",
           f"train.eval_interval={sizes.max_iters}", f"train.eval_iters={sizes.probe_val_batches}",
           f"train.probe_interval={sizes.probe_interval}", f"train.probe_sequences={sizes.probe_sequences}",
           f"train.probe_copy_length={sizes.probe_copy_length}", f"checkpoint.interval={sizes.max_iters}",
           "checkpoint.keep=1", "checkpoint.async_save=false", "optimizer.distributed=false",
           "optimizer.overlap_grad_reduce=false", "optimizer.overlap_param_gather=false", "logging.wandb=false",
           "precision.dtype=bf16", "parallel.timeout_minutes=5"]
    return out + ([f"train.exit_after_iters={exit_after}"] if exit_after else [])


@dataclass
class TimeShare:
    """A trainer's time share: SIGUSR1 (the trainer's graceful stop: a checkpoint at the next step, exit 75) once
    `seconds` have passed and the trainer's handler is installed (a start-up longer than the share still ends in
    the stop, not at the iteration cap), unless cancelled first. Outside the trainer's own handler (before it
    installs it, after it restores it) the signal is ignored, never the default action (the end of the process)."""

    seconds: float
    poll_s: float = 0.2
    fired: bool = False
    _thread: Optional[threading.Thread] = field(default=None, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _previous: Any = field(default=None, repr=False)

    def __enter__(self) -> "TimeShare":
        self._previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        if self._cancel.wait(self.seconds):
            return
        while signal.getsignal(signal.SIGUSR1) in (signal.SIG_IGN, signal.SIG_DFL, None):  # no handler yet
            if self._cancel.wait(self.poll_s):
                return
        self.fired = True
        os.kill(os.getpid(), signal.SIGUSR1)

    def __exit__(self, *exc) -> None:
        self._cancel.set()
        self._thread.join()
        signal.signal(signal.SIGUSR1, self._previous)


def train_arm(arm: str, work: Path, sizes: Sizes, corpus: Path, record: Record, seconds: float,
              exit_after: Optional[int] = None) -> int:
    """One arm's training run (this process) within `seconds`; its figures and probes into the record; returns the
    iterations it trained."""
    from cplm_megatron.pretrain import main as pretrain

    vocab = record.data["corpus"]["vocab_size"]
    run_dir = work / "runs" / f"study_{arm}"
    start = time.perf_counter()
    with TimeShare(seconds) as share:
        code = pretrain(["--config", RECIPE, "--set", *train_overrides(arm, sizes, corpus, run_dir, vocab, exit_after)])
    run_record = _run_record(run_dir)
    iterations = int(run_record.get("iterations") or 0)
    record.data["arms"].setdefault(arm, {})["train"] = {
        "exit_code": code, "seconds": round(time.perf_counter() - start, 1), "time_share_s": round(seconds, 1),
        "stopped_by": ("time share" if share.fired else "the CPLM's iteration count" if exit_after else "iteration cap"),
        "iterations": iterations, "tokens": iterations * sizes.tokens_per_step,
        "tokens_per_sec": run_record.get("tokens_per_sec"), "peak_memory_gib": run_record.get("peak_memory_gib"),
        "lm_head_loss": run_record.get("lm_head_loss"), "final_train_loss": _last_loss(run_dir)}
    record.data["arms"][arm]["probes"] = probes(run_dir, sizes.tokens_per_step)
    _release_memory()
    if code not in (0, 75) or not iterations:
        raise RuntimeError(f"training the {arm} arm exited {code} after {iterations} iterations")
    return iterations


def _run_record(run_dir: Path) -> Dict[str, Any]:
    for name in ("run_record.json", "run_record_stopped_early.json"):
        if (run_dir / name).exists():
            return json.loads((run_dir / name).read_text())
    return {}


def _metrics(run_dir: Path) -> List[Dict[str, Any]]:
    from cplm_megatron.training.metrics_log import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []


def _last_loss(run_dir: Path) -> Optional[float]:
    """The last logged training NLL of the output distribution (metrics.jsonl)."""
    losses = [r.get("mix_loss", r["loss"]) for r in _metrics(run_dir) if "loss" in r and "val_loss" not in r]
    return losses[-1] if losses else None


def probes(run_dir: Path, tokens_per_step: int) -> List[Dict[str, Any]]:
    """The run's probe records (metrics.jsonl), by iteration, with the tokens trained by then."""
    keys = ("probe_copy_accuracy", "probe_in_context_score", "probe_copy_chance")
    return [{"iteration": r["iteration"], "tokens": r["iteration"] * tokens_per_step, **{k: r.get(k) for k in keys}}
            for r in _metrics(run_dir) if "probe_copy_accuracy" in r]


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def score(arm: str, work: Path, sizes: Sizes, corpus: Path, plan: List[Tuple[List[str], int]]) -> Dict[str, Any]:
    """The tasks of `plan` ((names, limit) pairs) on the arm's last checkpoint; merged into
    WORK/study_eval_<arm>.json."""
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.runner import evaluate
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron

    common = dict(batch_size=sizes.eval_batch, show_progress=False, data=str(corpus / "val"),
                  dev_data=str(corpus / "dev"), copy_length=sizes.copy_length,
                  passkey_lengths=sizes.passkey_lengths, passkey_depths=sizes.passkey_depths)
    path = work / f"study_eval_{arm}.json"
    tasks: Dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    with single_process_megatron():
        scorer = MegatronScorer.load(work / "runs" / f"study_{arm}")
        for names, limit in plan:
            tasks.update(evaluate(scorer, names, EvalOptions(limit=limit, **common))["tasks"])
        del scorer
    _release_memory()
    path.write_text(json.dumps(tasks, indent=2))
    return tasks


def score_val(work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """Both arms' validation loss, the baseline + cache control and the paired differences."""
    for arm in ("baseline", "cplm"):
        tasks = score(arm, work, sizes, corpus, [(["val", "cache"] if arm == "baseline" else ["val"],
                                                  sizes.val_sequences)])
        record.data["arms"].setdefault(arm, {}).update(arm_figures(tasks))
        if arm == "baseline":
            record.data["controls"].update(control_figures(tasks))
    record.data["comparisons"].update(comparisons(work))


def score_tasks(work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """The copy and passkey tasks of both arms, with their controls."""
    for arm in ("baseline", "cplm"):
        tasks = score(arm, work, sizes, corpus, [(["copy"], sizes.copy_sequences),
                                                 (["passkey"], sizes.passkey_per_cell)])
        record.data["arms"][arm].update(arm_figures(tasks))
        if arm == "baseline":
            record.data["controls"].update(control_figures(tasks))


def _metric(tasks: Dict[str, Any], task: str, name: str) -> Any:
    return tasks.get(task, {}).get("metrics", {}).get(name)


def arm_figures(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """An arm's figures from its evaluation."""
    keys = {"val": ("val_loss", "val_loss_ci_low", "val_loss_ci_high", "val_lm_loss", "val_accuracy",
                    "val_in_context_score"),
            "copy": ("copy_accuracy", "copy_head_accuracy", "copy_mean_gate", "copy_sequence_accuracy"),
            "passkey": ("passkey_first_token_accuracy", "passkey_token_accuracy", "passkey_accuracy")}
    out = {name: _metric(tasks, task, name) for task, names in keys.items() for name in names}
    out["val_tokens"] = tasks.get("val", {}).get("details", {}).get("tokens")
    out["eval_seconds"] = round(sum(t.get("seconds", 0) for t in tasks.values()), 1)
    return {k: v for k, v in out.items() if v is not None}


def control_figures(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """The controls, named as such: the baseline + cache, and what copying or guessing gets on the synthetic tasks."""
    out: Dict[str, Any] = {}
    if "cache" in tasks:
        out["baseline_plus_cache"] = {"val_loss": _metric(tasks, "cache", "cache_val_loss"),
                                      "val_loss_ci": [_metric(tasks, "cache", "cache_val_loss_ci_low"),
                                                      _metric(tasks, "cache", "cache_val_loss_ci_high")],
                                      "lambda": _metric(tasks, "cache", "cache_lambda"),
                                      "theta": _metric(tasks, "cache", "cache_theta")}
    if "copy" in tasks:
        out["copy_one_token_match_copier"] = {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_one_token_match")}
        out["copy_chance"] = {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_chance")}
    if "passkey" in tasks:
        out["passkey_chance"] = {"passkey_first_token_accuracy": _metric(tasks, "passkey",
                                                                         "passkey_first_token_chance")}
    return out


def _documents(work: Path, arm: str, task: str) -> Optional[Dict[int, tuple]]:
    path = work / f"study_eval_{arm}.json"
    if not path.exists():
        return None
    docs = json.loads(path.read_text()).get(task, {}).get("details", {}).get("documents")
    return None if docs is None else {i: (n, c) for i, n, c in zip(docs["ids"], docs["nll"], docs["count"])}


def comparisons(work: Path) -> Dict[str, Any]:
    """CPLM - baseline and CPLM - (baseline + cache) val loss, paired over the same documents (95% bootstrap)."""
    from cplm_megatron.evaluation.metrics import bootstrap_paired_ci

    cplm = _documents(work, "cplm", "val")
    out: Dict[str, Any] = {}
    for name, other in (("cplm_minus_baseline", _documents(work, "baseline", "val")),
                        ("cplm_minus_baseline_plus_cache", _documents(work, "baseline", "cache"))):
        if cplm is None or other is None:
            continue
        ids = sorted(set(cplm) & set(other))
        diff, low, high = bootstrap_paired_ci([cplm[i][0] for i in ids], [other[i][0] for i in ids],
                                              [cplm[i][1] for i in ids])
        out[name] = {"val_loss": diff, "ci": [low, high], "documents": len(ids)}
    return out


def arm_share(sizes: Sizes, deadline: float) -> float:
    """Seconds each arm may train: the time to the deadline less the scoring reserve, in two, at most
    SIZES.max_arm_seconds."""
    return max(1.0, min(sizes.max_arm_seconds, (deadline - time.monotonic() - sizes.score_reserve_s) / 2))


def train_both(work: Path, sizes: Sizes, corpus: Path, record: Record, deadline: float) -> bool:
    """The CPLM within its share, then the baseline for as many iterations; False if either failed."""
    share = arm_share(sizes, deadline)
    box: Dict[str, int] = {}
    ok = run_phase(record, "train_cplm", lambda: box.update(n=train_arm("cplm", work, sizes, corpus, record, share)))
    ok = ok and run_phase(record, "train_baseline", lambda: train_arm(
        "baseline", work, sizes, corpus, record, 1.5 * share, exit_after=box["n"] if box["n"] < sizes.max_iters else None))
    arms = record.data["arms"]
    if ok:
        record.data["equal_tokens"] = arms["cplm"]["train"]["tokens"] == arms["baseline"]["train"]["tokens"]
    record.write()
    return ok


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, help="the check's working directory (study.json goes there)")
    p.add_argument("--tiny", action="store_true", help="the CPU dry run's sizes")
    p.add_argument("--budget", type=float, help="seconds the step may take (default: the sizes' budget)")
    args = p.parse_args(argv)
    sizes = TINY if args.tiny else GPU
    deadline = time.monotonic() + (args.budget or sizes.budget_s)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    record = Record(work, sizes, args.tiny, args.budget or sizes.budget_s)
    box: Dict[str, Path] = {}
    ok = run_phase(record, "corpus", lambda: box.update(corpus=build_corpus(work, sizes, record)))
    if ok:
        record.data["estimate"] = estimate(sizes, record.data["corpus"]["vocab_size"])
        ok = train_both(work, sizes, box["corpus"], record, deadline)
    if ok:  # both arms' validation loss and the cache control first: a cut then loses only the synthetic tasks
        ok = run_phase(record, "score_val", lambda: score_val(work, sizes, box["corpus"], record))
        ok = run_phase(record, "score_tasks", lambda: score_tasks(work, sizes, box["corpus"], record)) and ok
    record.data["complete"] = ok
    record.write()
    print(f"[study] {'complete' if ok else 'INCOMPLETE'}: {record.path}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
