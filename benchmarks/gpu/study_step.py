"""The GPU check's `study` step: SmolLM2-135M baseline vs the recipe's CPLM, trained for the same tokens on the code
corpus of this machine's own installed Python sources and scored on its validation split beside their controls.

    python benchmarks/gpu/study_step.py WORK_DIR [--tiny]

Run from the check's scratch tree (benchmarks/, pretrain/, configs/) with the project, megatron-core and the carried
wheels (mosaicml-streaming and its compiled needs) installed. One process, four phases; WORK_DIR/study.json is
rewritten as each ends (a budget cut keeps what finished):

1. corpus: cplm_megatron.data.code_corpus over this interpreter's standard library and site-packages (at most
   SIZES.corpus_bytes of sources, whole distributions; split by distribution, deduplicated, BPE 49,152, every core).
2. train: configs/smollm2_135m.yaml with copy_head.enabled false (baseline), then true (the recipe's CPLM: aux1),
   the same seed, data order and tokens (cplm_megatron.pretrain in this process), one checkpoint at the end.
3. evaluate, per arm: validation loss (first SIZES.val_sequences samples of the validation split, a 95% interval
   over documents), the copy task with its controls (chance, the one-token-match copier) and the passkey task
   (first key token, beside chance); for the baseline also the baseline + continuous cache control (lambda/theta
   tuned on the dev split). CPLM - baseline and CPLM - (baseline + cache) are paired over the same documents.

--tiny: the CPU dry run's sizes (the tiny preset, a 3 MB corpus, a few steps): it checks the step, not a result.
Exit 0 when every phase finished, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

RECIPE = "configs/smollm2_135m.yaml"
ARMS = ("baseline", "cplm")


@dataclass(frozen=True)
class Sizes:
    """How big each phase is."""

    preset: str
    corpus_bytes: int
    vocab_size: int
    seq_len: int
    corpus_settings: Dict[str, float]  # CodeCorpusSettings overrides (the tiny corpus needs larger held-out shares)
    micro_batch: int
    global_batch: int
    iters: int
    warmup_iters: int
    lr: float
    eval_batch: int
    val_sequences: int  # validation samples scored (and dev samples the cache is tuned on)
    copy_sequences: int
    copy_length: int
    passkey_per_cell: int
    passkey_lengths: tuple
    passkey_depths: tuple = (0.0, 0.5, 1.0)

    @property
    def train_tokens(self) -> int:
        return self.iters * self.global_batch * self.seq_len


# H200, from the 2026-12-04 figures: 135M trains ~128k tokens/s (Megatron's LM-head loss, the recipe's `auto`), the CPLM
# ~10% slower; 256 steps of 16 x 2048 tokens = 8.4M tokens per arm (~65 s and ~75 s), see docs/gpu-check.md.
GPU = Sizes(preset="smollm2-135m", corpus_bytes=200_000_000, vocab_size=49152, seq_len=2048, corpus_settings={},
            micro_batch=16, global_batch=16, iters=256, warmup_iters=25, lr=1e-3, eval_batch=8, val_sequences=128,
            copy_sequences=64, copy_length=512, passkey_per_cell=16, passkey_lengths=(256, 1024, 2048))
TINY = Sizes(preset="tiny", corpus_bytes=3_000_000, vocab_size=512, seq_len=128,
             corpus_settings={"val_fraction": 0.15, "dev_fraction": 0.1, "max_distribution_share": 1.0,
                              "max_document_share": 0.25, "tokenizer_sample_bytes": 400_000},
             micro_batch=2, global_batch=2, iters=6, warmup_iters=2, lr=1e-3, eval_batch=4, val_sequences=16,
             copy_sequences=4, copy_length=64, passkey_per_cell=2, passkey_lengths=(64, 128), passkey_depths=(0.0, 1.0))


class Record:
    """WORK_DIR/study.json, rewritten (through a temporary and a rename) after every phase."""

    def __init__(self, work: Path, sizes: Sizes, tiny: bool):
        self.path = work / "study.json"
        self.data: Dict[str, Any] = {
            "dry_run": tiny, "complete": False, "sizes": {**asdict(sizes), "train_tokens_per_arm": sizes.train_tokens},
            "phases": {}, "corpus": None, "arms": {}, "controls": {}, "comparisons": {},
            "note": ("val_loss: mean NLL of the model's full distribution (the mixture for the CPLM) on the first "
                     "val_sequences samples of the validation split; controls: the baseline + continuous cache (Grave "
                     "et al. 2017; lambda/theta tuned on the dev split), copy chance and the one-token-match copier "
                     "(predicts the current token's most frequent earlier successor), passkey chance; comparisons: "
                     "paired over the same validation documents, 95% document bootstrap")}
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
    """The code corpus of this machine's installed sources -> WORK/runs/code (the shards stay out of the check's
    tarball; its split.json is copied to WORK/study_split.json); its figures into the record."""
    import shutil

    from cplm_megatron.data.code_corpus import SPLIT_RECORD, CodeCorpusSettings, build_code_corpus

    settings = CodeCorpusSettings(vocab_size=sizes.vocab_size, seq_len=sizes.seq_len, **sizes.corpus_settings)
    corpus = build_code_corpus(work / "runs" / "code", settings, max_bytes=sizes.corpus_bytes, show_progress=False)
    shutil.copy(corpus.root / SPLIT_RECORD, work / "study_split.json")
    r = corpus.record
    record.data["corpus"] = {
        "seconds": r["seconds"], "workers": r["workers"], "python": r["python"],
        "distributions": len(r["distributions"]), "source_bytes": sum(d["bytes"] for d in r["distributions"]),
        "splits": {k: {f: v[f] for f in ("distributions", "documents", "tokens", "bytes")} for k, v in r["splits"].items()},
        "vocab_size": r["tokenizer"]["vocab_size"],
        "val_largest_document_share": r["splits"]["val"]["largest_document_share"],
        "val_shingles_in_train": r["held_out_overlap"]["val"]["fraction_in_train"],
        "val_files_in_train": r["held_out_overlap"]["val"]["files_in_train"]}
    return corpus.root


def train_overrides(arm: str, sizes: Sizes, corpus: Path, run_dir: Path, vocab: int) -> List[str]:
    """The `--set` overrides of the recipe for one arm (only copy_head.enabled differs between the arms)."""
    return [f"run.dir={run_dir}", f"model.preset={sizes.preset}", f"model.vocab_size={vocab}",
            f"copy_head.enabled={'true' if arm == 'cplm' else 'false'}", "model.attention_impl=sdpa",
            f"data.streams=[{corpus / 'train'}]", f"data.val_streams=[{corpus / 'val'}]", "data.num_workers=2",
            "train.tokens=null", f"train.iters={sizes.iters}", f"train.seq_len={sizes.seq_len}",
            f"train.micro_batch={sizes.micro_batch}", f"train.global_batch={sizes.global_batch}",
            f"train.lr={sizes.lr}", f"schedule.warmup_iters={sizes.warmup_iters}", "train.log_interval=10",
            "train.eval_interval=0", f"checkpoint.interval={sizes.iters}", "checkpoint.keep=1",
            "checkpoint.async_save=false", "optimizer.distributed=false", "optimizer.overlap_grad_reduce=false",
            "optimizer.overlap_param_gather=false", "logging.wandb=false", "precision.dtype=bf16",
            "parallel.timeout_minutes=5"]


def train_arm(arm: str, work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """One arm's training run (this process); its tokens, time and rate into the record."""
    from cplm_megatron.pretrain import main as pretrain

    vocab = record.data["corpus"]["vocab_size"]
    run_dir = work / "runs" / f"study_{arm}"
    start = time.perf_counter()
    code = pretrain(["--config", RECIPE, "--set", *train_overrides(arm, sizes, corpus, run_dir, vocab)])
    seconds = time.perf_counter() - start
    run_record = json.loads((run_dir / "run_record.json").read_text()) if (run_dir / "run_record.json").exists() else {}
    record.data["arms"].setdefault(arm, {})["train"] = {
        "exit_code": code, "seconds": round(seconds, 1), "tokens": sizes.train_tokens, "iterations": sizes.iters,
        "tokens_per_sec": run_record.get("tokens_per_sec"), "peak_memory_gib": run_record.get("peak_memory_gib"),
        "lm_head_loss": run_record.get("lm_head_loss"), "final_train_loss": _last_loss(run_dir)}
    _release_memory()
    if code != 0:
        raise RuntimeError(f"training the {arm} arm exited {code}")


def _last_loss(run_dir: Path) -> Optional[float]:
    """The last logged training NLL of the output distribution (metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    last = None
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in entry and "val_loss" not in entry:
            last = entry.get("mix_loss", entry["loss"])
    return last


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def evaluate_arm(arm: str, work: Path, sizes: Sizes, corpus: Path, record: Record) -> None:
    """val (+ cache for the baseline), copy and passkey on the arm's last checkpoint; figures into the record."""
    from cplm_megatron.evaluation.options import EvalOptions
    from cplm_megatron.evaluation.runner import evaluate
    from cplm_megatron.evaluation.scorers import MegatronScorer, single_process_megatron

    common = dict(batch_size=sizes.eval_batch, show_progress=False, data=str(corpus / "val"),
                  dev_data=str(corpus / "dev"), copy_length=sizes.copy_length,
                  passkey_lengths=sizes.passkey_lengths, passkey_depths=sizes.passkey_depths)
    plan = [(["val", "cache"] if arm == "baseline" else ["val"], sizes.val_sequences), (["copy"], sizes.copy_sequences),
            (["passkey"], sizes.passkey_per_cell)]
    tasks: Dict[str, Any] = {}
    with single_process_megatron():
        scorer = MegatronScorer.load(work / "runs" / f"study_{arm}")
        for names, limit in plan:
            tasks.update(evaluate(scorer, names, EvalOptions(limit=limit, **common))["tasks"])
        del scorer
    _release_memory()
    (work / f"study_eval_{arm}.json").write_text(json.dumps(tasks, indent=2))
    record.data["arms"].setdefault(arm, {}).update(arm_figures(tasks))
    if arm == "baseline":
        record.data["controls"].update(control_figures(tasks))
    record.data["comparisons"].update(comparisons(work))


def _metric(tasks: Dict[str, Any], task: str, name: str) -> Any:
    return tasks.get(task, {}).get("metrics", {}).get(name)


def arm_figures(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """An arm's figures from its evaluation."""
    keys = {"val": ("val_loss", "val_loss_ci_low", "val_loss_ci_high", "val_lm_loss", "val_accuracy"),
            "copy": ("copy_accuracy", "copy_head_accuracy", "copy_mean_gate", "copy_sequence_accuracy"),
            "passkey": ("passkey_first_token_accuracy", "passkey_token_accuracy", "passkey_accuracy")}
    out = {name: _metric(tasks, task, name) for task, names in keys.items() for name in names}
    out["val_tokens"] = tasks.get("val", {}).get("details", {}).get("tokens")
    out["eval_seconds"] = round(sum(t.get("seconds", 0) for t in tasks.values()), 1)
    return {k: v for k, v in out.items() if v is not None}


def control_figures(tasks: Dict[str, Any]) -> Dict[str, Any]:
    """The controls, named as such: the baseline + cache, and what copying or guessing gets on the synthetic tasks."""
    return {
        "baseline_plus_cache": {"val_loss": _metric(tasks, "cache", "cache_val_loss"),
                                "val_loss_ci": [_metric(tasks, "cache", "cache_val_loss_ci_low"),
                                                _metric(tasks, "cache", "cache_val_loss_ci_high")],
                                "lambda": _metric(tasks, "cache", "cache_lambda"),
                                "theta": _metric(tasks, "cache", "cache_theta")},
        "copy_one_token_match_copier": {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_one_token_match")},
        "copy_chance": {"copy_accuracy": _metric(tasks, "copy", "copy_accuracy_chance")},
        "passkey_chance": {"passkey_first_token_accuracy": _metric(tasks, "passkey", "passkey_first_token_chance")},
    }


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


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, help="the check's working directory (study.json goes there)")
    p.add_argument("--tiny", action="store_true", help="the CPU dry run's sizes")
    args = p.parse_args(argv)
    sizes = TINY if args.tiny else GPU
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    record = Record(work, sizes, args.tiny)
    box: Dict[str, Path] = {}
    ok = run_phase(record, "corpus", lambda: box.update(corpus=build_corpus(work, sizes, record)))
    for arm in ARMS:
        ok = ok and run_phase(record, f"train_{arm}", lambda arm=arm: train_arm(arm, work, sizes, box["corpus"], record))
    trained = [a for a in ARMS if record.data["phases"].get(f"train_{a}", {}).get("ok")]
    for arm in reversed(trained):  # the CPLM first: a cut budget then still leaves its figures beside the baseline's
        ok = run_phase(record, f"evaluate_{arm}",
                       lambda arm=arm: evaluate_arm(arm, work, sizes, box["corpus"], record)) and ok
    record.data["complete"] = ok and len(trained) == len(ARMS)
    record.write()
    print(f"[study] {'complete' if record.data['complete'] else 'INCOMPLETE'}: {record.path}", flush=True)
    return 0 if record.data["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
