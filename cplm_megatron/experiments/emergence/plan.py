"""The emergence study as runs: a pilot over model sizes and batch shapes, and the grid domains x arms x seeds.

Every run trains the tiny preset's backbone at `hidden` x `layers` on one domain's corpus (vocabulary 4096, 256
tokens per sequence) with a declared share of training samples holding a repeated span of their own text
(`data.repeat_span_share`, the same samples in every arm of a seed), small batches (induction heads form after
~10^5.7 sqrt(B C) tokens, B sequences of C tokens per step: Aoyama et al. 2025), and the in-training probe (copy
accuracy, in-context score, held-out text copying) every `probe_interval` steps. Runs of one domain and seed share
initialization and data order. The last checkpoint is evaluated on every validation sample (val), the copy task on
random tokens, held-out text repeated (text_copy) and, for the baseline, the continuous-cache control.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cplm_megatron.experiments.run import Evaluation, Run, Value
from cplm_megatron.experiments.study.plan import ARMS

SEQ_LEN, MICRO_BATCH, MAX_POSITIONS = 256, 4, 1024


@dataclass(frozen=True)
class Domain:
    """A corpus the study trains on: its directory under the data root and how it is built."""

    name: str
    corpus: str
    build: str  # the command that builds it (what the report names)


DOMAINS: dict[str, Domain] = {d.name: d for d in (
    Domain("code", "code_v4096", "tools/build_code_corpus.py --output DATA/code_v4096 --vocab-size 4096 --seq-len 256 "
           "--max-bytes 60000000 --dev-fraction 0.05 --max-distribution-share 1.0"),
    Domain("prose", "prose_v4096", "tools/build_prose_corpus.py --install --output DATA/prose_v4096 "
           "--code-corpus DATA/code_v4096"),
)}


@dataclass(frozen=True)
class Shape:
    """A model and batch shape: the backbone's width and depth, sequences per step, steps."""

    hidden: int
    layers: int
    global_batch: int
    iters: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * SEQ_LEN


@dataclass
class EmergenceSettings:
    """The study's grid and its training settings; `smoke()` is the CI-sized variant."""

    domains: tuple[str, ...] = ("code", "prose")
    arms: tuple[str, ...] = ("baseline", "aux1")
    seeds: tuple[int, ...] = (1, 2, 3)
    shape: Shape = Shape(hidden=64, layers=4, global_batch=4, iters=25000)
    repeat_span_share: float = 0.25
    probe_interval: int = 1000
    probe_sequences: int = 64
    eval_interval: int = 1000
    eval_iters: int = 8
    warmup_iters: int = 100
    copy_threshold: float = 0.1  # the baselines' text copy gain at or above which a claim can be credited
    eval_sequences: int = 64
    val_all: bool = True

    @classmethod
    def smoke(cls) -> EmergenceSettings:
        """Both domains, two arms, two seeds, a few steps: the whole pipeline in CI."""
        return cls(seeds=(1, 2), shape=Shape(hidden=64, layers=2, global_batch=4, iters=6), probe_interval=3,
                   probe_sequences=4, eval_interval=3, eval_iters=2, warmup_iters=2, eval_sequences=4, val_all=False)

    def validate(self) -> None:
        """ValueError naming the bad setting."""
        unknown = [a for a in self.arms if a not in ARMS] + [d for d in self.domains if d not in DOMAINS]
        if unknown:
            raise ValueError(f"unknown arm(s)/domain(s) {unknown}; arms: {', '.join(ARMS)}; domains: "
                             f"{', '.join(DOMAINS)}")
        if not self.domains:  # `--domains ,` ran nothing and reported it with exit 0
            raise ValueError(f"no domain chosen; domains: {', '.join(DOMAINS)}")
        if "baseline" not in self.arms or len(self.arms) < 2 or len(set(self.seeds)) < 2:
            raise ValueError("the study compares >= 1 CPLM arm with the baseline over >= 2 seeds")
        s = self.shape
        if s.iters % self.eval_interval or s.iters % self.probe_interval or s.global_batch % MICRO_BATCH:
            raise ValueError(f"iters={s.iters} must be a multiple of the eval and probe intervals, and the global "
                             f"batch {s.global_batch} of the micro batch {MICRO_BATCH}")

    def planned(self) -> list[tuple[str, str, int]]:
        """(domain, arm, seed) of every run (the recipe study's (scale, arm, seed) with the domain as its scale)."""
        return [(d, a, s) for d in self.domains for a in self.arms for s in self.seeds]


def corpus_dirs(domains: tuple[str, ...], data_root: Path) -> dict[str, Path]:
    """Each domain's corpus directory under `data_root`."""
    return {d: Path(data_root).resolve() / DOMAINS[d].corpus for d in domains}


def training_settings(shape: Shape, data: Path, settings: EmergenceSettings, seed: int
                      ) -> tuple[tuple[str, Value], ...]:
    """Every trainer setting of a run but the arm's."""
    common: dict[str, Value] = {
        "logging.wandb": False, "model.hidden_size": shape.hidden, "model.num_layers": shape.layers,
        "model.vocab_size": 4096, "model.max_position_embeddings": MAX_POSITIONS,
        "data.streams": [data / "train"], "data.val_streams": [data / "val"],
        "data.repeat_span_share": settings.repeat_span_share,
        "train.iters": shape.iters, "train.seq_len": SEQ_LEN, "train.micro_batch": MICRO_BATCH,
        "train.global_batch": shape.global_batch, "train.eval_interval": settings.eval_interval,
        "train.eval_iters": settings.eval_iters, "train.log_interval": settings.eval_interval,
        "train.probe_interval": settings.probe_interval, "train.probe_sequences": settings.probe_sequences,
        "schedule.warmup_iters": settings.warmup_iters,
        "checkpoint.interval": max(settings.eval_interval, shape.iters // 5 // settings.eval_interval
                                   * settings.eval_interval), "checkpoint.keep": 1,
        "run.seed": seed, "data.seed": seed,
    }
    return tuple(common.items())


def emergence_runs(settings: EmergenceSettings, corpora: dict[str, Path]) -> list[Run]:
    """Every run of the grid, domain by domain and seed by seed (a seed's arms finish together)."""
    settings.validate()
    runs = []
    shape = settings.shape
    for domain in settings.domains:
        data = corpora[domain]
        for seed in settings.seeds:
            for arm_name in settings.arms:
                arm = ARMS[arm_name]
                labels: dict[str, Any] = {"arm": arm_name, "scale": domain, "domain": domain, "seed": seed,
                                          "hidden": shape.hidden, "layers": shape.layers, "vocab": 4096,
                                          "iters": shape.iters, "tokens_per_step": shape.tokens_per_step,
                                          "copy_head": arm.copy_head}
                tasks = ("val", "copy", "text_copy") + (("cache",) if not arm.copy_head else ())
                evaluation = Evaluation(tasks, limit=settings.eval_sequences, data=str(data / "val"),
                                        dev_data=str(data / "dev"), copy_length=128, val_all=settings.val_all,
                                        every_checkpoint=False)
                runs.append(Run(f"{domain}-{arm_name}-s{seed}", f"{domain}-s{seed}",
                                (("copy_head.enabled", arm.copy_head),
                                 *training_settings(shape, data, settings, seed), *arm.settings),
                                evaluation, tuple(sorted(labels.items())), experiment="emergence"))
    return runs


@dataclass
class PilotSettings:
    """The pilot: baselines only, per (domain, shape, share), their probe curves and speed."""

    variants: tuple[tuple[str, Shape, float], ...] = field(default_factory=lambda: (
        ("code", Shape(64, 4, 4, 25000), 0.25),   # the candidate: B C = 1024 -> ~1.6e7 tokens by the law
        ("code", Shape(128, 4, 4, 25000), 0.25),  # twice the width: does random-token copying follow?
        ("prose", Shape(64, 4, 4, 25000), 0.25),  # the second domain at the candidate's shape
        ("code", Shape(64, 4, 8, 12500), 0.25),   # the same tokens in twice the batch: the law says later
    ))
    probe_interval: int = 1000


def pilot_runs(settings: PilotSettings, corpora: dict[str, Path], study: EmergenceSettings) -> list[Run]:
    """One baseline run per pilot variant (seed 1), evaluated on the copy task at its end."""
    runs = []
    for domain, shape, share in settings.variants:
        name = f"{domain}-h{shape.hidden}x{shape.layers}-b{shape.global_batch}-r{round(share * 100)}"
        labels = {"domain": domain, "hidden": shape.hidden, "layers": shape.layers, "global_batch": shape.global_batch,
                  "iters": shape.iters, "repeat_span_share": share, "tokens_per_step": shape.tokens_per_step}
        options = EmergenceSettings(**{**study.__dict__, "repeat_span_share": share,
                                       "probe_interval": settings.probe_interval})
        runs.append(Run(name, "pilot", (("copy_head.enabled", False),
                                        *training_settings(shape, corpora[domain], options, 1)),
                        Evaluation(("copy", "text_copy"), limit=study.eval_sequences, data=str(corpora[domain] / "val"),
                                   copy_length=128, every_checkpoint=False),
                        tuple(sorted(labels.items())), experiment="emergence-pilot"))
    return runs
