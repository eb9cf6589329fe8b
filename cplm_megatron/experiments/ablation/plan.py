"""The baseline-vs-CPLM ablation as a plan over the run type.

    runs = ablation_runs(AblationSettings.quick(), data_dir=Path("data/stdlib"))

Every pair of ablation runs differs only in `copy_head.enabled`: same recipe, seed, data order and steps (and the
same backbone initialization, since the Copy-Paste head is built after the backbone).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from cplm_megatron.experiments.run import Evaluation, Run, Value


@dataclass
class AblationSettings:
    """Sizes of the ablation; `quick()` is the CI/demo variant, `full()` the longer one."""

    hidden_size: int = 64
    spamlang_vocabs: tuple[int, ...] = (4096, 8192, 16384)
    spamlang_ties: tuple[bool, ...] = (False, True)  # tie_embeddings variants (untied: Godey & Artzi's setting)
    spamlang_iters: int = 60
    spamlang_interval: int = 5  # checkpoint (and evaluation) interval
    spamlang_seq_len: int = 128
    corpus_iters: int = 600
    corpus_interval: int = 100
    corpus_val_interval: int = 0  # the trainer's validation interval (0: the checkpoint interval)
    eval_sequences: int = 32  # sequences per task and checkpoint (passkey: per cell)
    experiments: tuple[str, ...] = ("corpus", "spamlang")
    seed: int = 1234  # run.seed and data.seed of every run (the recipes' default)
    extra_settings: tuple[tuple[str, Value], ...] = ()  # applied last to every run (e.g. an arm's objective)

    @classmethod
    def quick(cls) -> AblationSettings:
        return cls(spamlang_ties=(False,), spamlang_iters=20, spamlang_interval=5, corpus_iters=60,
                   corpus_interval=20, eval_sequences=16)

    @classmethod
    def full(cls) -> AblationSettings:
        return cls()


def _pair(group: str, experiment: str, settings: dict[str, Value], evaluation: Evaluation, labels: dict[str, Any],
          extra: Sequence[tuple[str, Value]] = ()) -> list[Run]:
    return [Run(f"{group}-{'cplm' if cplm else 'baseline'}", group, (("copy_head.enabled", cplm), *settings.items(),
                                                                     *extra),
                evaluation, tuple(sorted({**labels, "copy_head": cplm}.items())), experiment=experiment)
            for cplm in (False, True)]


def ablation_runs(settings: AblationSettings, data_dir: Path | None) -> list[Run]:
    """The runs of an ablation, in launch order (longest first)."""
    from cplm_megatron.data.manifest import read_manifest

    s = settings
    runs: list[Run] = []
    common: dict[str, Value] = {"logging.wandb": False, "model.hidden_size": s.hidden_size, "checkpoint.keep": 1000,
                                "train.log_interval": 5, "run.seed": s.seed, "data.seed": s.seed}
    if "corpus" in s.experiments:
        if data_dir is None:
            raise ValueError("the corpus experiment needs the embedded corpus: pass --data DIR (make data)")
        data_dir = Path(data_dir).resolve()
        for split in ("train", "val"):
            if not (data_dir / split / "manifest.json").is_file():
                raise FileNotFoundError(f"{data_dir / split} is not a prepared dataset; build it with "
                                        f"`make data` (tools/build_stdlib_corpus.py --output {data_dir})")
        manifest = read_manifest(str(data_dir / "train"))  # the model takes the corpus' vocabulary and length
        vocab, seq_len = manifest.tokenizer.vocab_size, manifest.seq_len
        corpus = {**common, "model.vocab_size": vocab, "data.streams": [data_dir / "train"],
                  "data.val_streams": [data_dir / "val"], "train.iters": s.corpus_iters, "train.seq_len": seq_len,
                  "train.micro_batch": 4, "train.global_batch": 8,
                  "train.eval_interval": s.corpus_val_interval or s.corpus_interval,
                  "train.eval_iters": 4, "checkpoint.interval": s.corpus_interval}
        evaluation = Evaluation(("val", "copy", "passkey", "gradient"), limit=s.eval_sequences, gradient_source="val",
                                copy_length=min(128, seq_len),
                                passkey_lengths=tuple(sorted({64, seq_len // 2, seq_len})),
                                passkey_depths=(0.0, 0.5, 1.0))
        runs += _pair("corpus", "corpus", corpus, evaluation,
                      {"vocab": vocab, "hidden": s.hidden_size, "tied": True, "iters": s.corpus_iters},
                      s.extra_settings)
    if "spamlang" in s.experiments:
        for vocab in sorted(s.spamlang_vocabs, reverse=True):
            for tied in s.spamlang_ties:
                group = f"spamlang-v{vocab}-{'tied' if tied else 'untied'}"
                spam = {**common, "data.synthetic": "spamlang", "model.vocab_size": vocab,
                        "model.tie_embeddings": tied, "train.iters": s.spamlang_iters,
                        "train.seq_len": s.spamlang_seq_len, "train.micro_batch": 8, "train.global_batch": 8,
                        "train.eval_interval": 0, "checkpoint.interval": s.spamlang_interval}
                evaluation = Evaluation(("spamlang", "gradient"), limit=s.eval_sequences, gradient_source="spamlang",
                                        spamlang_length=s.spamlang_seq_len)
                runs += _pair(group, "spamlang", spam, evaluation,
                              {"vocab": vocab, "hidden": s.hidden_size, "tied": tied, "iters": s.spamlang_iters},
                              s.extra_settings)
    return runs
