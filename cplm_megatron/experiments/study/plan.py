"""The recipe study as a plan over the run type: training-objective arms x seeds x model scales.

    runs = study_runs(StudySettings(), ensure_corpora(StudySettings(), Path("data")))

Runs of one seed and scale share the backbone initialization and the data order, so every CPLM arm is compared
with "its" baseline (paired differences).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cplm_megatron.experiments.run import Evaluation, Run, Value, set_arguments


@dataclass(frozen=True)
class Arm:
    """One training objective: the baseline (no copy head) or a CPLM with copy-head settings."""

    name: str
    copy_head: bool
    settings: tuple[tuple[str, Value], ...]
    description: str
    retired: str = ""  # why the study no longer runs it by default (still runnable with --arms)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The settings as `--set` text (what the study's summary lists)."""
        return tuple(set_arguments(self.settings))


def _objective(lm: float, copy: float, mixing: str = "gate", decouple: bool = False) -> tuple[tuple[str, Value], ...]:
    """Every objective key of a CPLM arm, so a recipe default cannot leak into an arm."""
    return (("copy_head.lm_loss_weight", float(lm)), ("copy_head.copy_loss_weight", float(copy)),
            ("copy_head.mixing", mixing), ("copy_head.decouple_lm", decouple))


# From the simplest to the most complex (the decision rule's "simpler arm" is the earlier one).
ARMS: dict[str, Arm] = {a.name: a for a in (
    Arm("baseline", False, (), "the backbone alone (copy_head.enabled=false)"),
    Arm("mixture", True, _objective(0, 0), "pure mixture NLL (gate mixing)"),
    Arm("aux1", True, _objective(1, 0), "mixture NLL + 1 x the LM head's own cross entropy (the recipe default)"),
    Arm("aux1+copy", True, _objective(1, 1), "aux1 + 1 x the copy-only NLL where a candidate proposes the label "
        "(copy_head.copy_loss_weight=1)",
        retired="in the v2 study's seed 1 (paired over validation documents) it beat the baseline + cache control by "
                "only -0.036 nats where aux1 won by -0.103 and sentinel+aux1 by -0.144: the copy-only term added "
                "nothing over aux1 (cost of the grid: 5 seeds x 2 scales)"),
    Arm("sentinel", True, _objective(0, 0, "sentinel"), "pure mixture NLL with sentinel mixing (a pointer sentinel "
        "per copy head, g = mean_c sigmoid(lse_c - sigma_c))",
        retired="in the v2 study's seed 1 it lost to the baseline + cache control (+0.115 nats), as the pure mixture "
                "did (+0.125, kept as the pure-mixture control); sentinel+aux1 carries the sentinel rule"),
    Arm("sentinel+aux1", True, _objective(1, 0, "sentinel"), "sentinel mixing + 1 x the LM head's own cross entropy"),
    Arm("aux0.5", True, _objective(0.5, 0), "mixture NLL + 0.5 x the LM head's own cross entropy",
        retired="dominated by aux1 in the previous study (paired val loss -0.048 / -0.022, lower LM-head val loss and "
                "fewer tokens to the baseline's loss in both seeds); the LM-loss weight is not the open question"),
    Arm("decoupled", True, _objective(1, 0, decouple=True), "the LM head's parameters learn from its own cross entropy "
        "only (the mixture treats log p_LM as a constant there); the backbone still gets the copy and gate gradients",
        retired="dominated by aux1 in the previous study (paired val loss -0.080 / -0.074 in aux1's favour, higher "
                "LM-head val loss 3.50 vs 3.42, efficiency 0.57 vs 0.48)"),
)}
ACTIVE_ARMS: tuple[str, ...] = tuple(name for name, arm in ARMS.items() if not arm.retired)
CACHE_ARM = "baseline+cache"  # evaluation only: the baseline's checkpoints with the continuous cache (tasks/cache.py)


@dataclass(frozen=True)
class Scale:
    """A model size of the study: the tiny preset at another width/depth, and its corpus vocabulary."""

    name: str
    hidden: int
    layers: int
    vocab: int
    iters: int
    eval_interval: int  # trainer validation interval (the val curve's resolution)

    @property
    def corpus(self) -> str:
        """The corpus directory name under the data root (the default corpus has vocabulary 4096)."""
        return "stdlib" if self.vocab == 4096 else f"stdlib_v{self.vocab}"


# The tiny preset (ffn 384, 4 heads / 2 KV groups) at hidden 64 x 4 layers: 0.34M non-embedding parameters,
# 4.42M training FLOPs per token; at hidden 128 x 8 layers: 1.57M parameters, 15.7M FLOPs per token (3.6x).
# Both read the same corpus (one tokenizer, vocabulary 4096, one validation split), for the same tokens, so their
# losses are read side by side.
SCALES: dict[str, Scale] = {s.name: s for s in (
    Scale("tiny", hidden=64, layers=4, vocab=4096, iters=1600, eval_interval=100),
    Scale("small", hidden=128, layers=8, vocab=4096, iters=1600, eval_interval=100),
)}
# The second scale repeats the baseline and the two best tiny arms (by the v2 study's seed-1 paired differences
# against the cache control: sentinel+aux1 -0.144, aux1 -0.103); the summary checks them against the tiny grid.
SECOND_SCALE_ARMS: tuple[str, ...] = ("baseline", "aux1", "sentinel+aux1")
SEQ_LEN, MICRO_BATCH, GLOBAL_BATCH = 256, 4, 8
MAX_POSITIONS = 1024  # RoPE: passkey retrieval is measured up to 4x the training length


@dataclass
class StudySettings:
    """What the study runs; `smoke()` is the CI-sized variant. `arms`/`seeds` are the first scale's; a scale in
    `scale_arms`/`scale_seeds` runs those instead (its arms restricted to `arms`)."""

    arms: tuple[str, ...] = ACTIVE_ARMS
    seeds: tuple[int, ...] = (1, 2, 3, 4, 5)
    scales: tuple[str, ...] = tuple(SCALES)
    scale_arms: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"small": SECOND_SCALE_ARMS})
    scale_seeds: dict[str, tuple[int, ...]] = field(default_factory=lambda: {"small": (1, 2, 3)})
    iters: dict[str, int] = field(default_factory=dict)  # per-scale override of Scale.iters
    eval_interval: int | None = None  # override of Scale.eval_interval
    eval_iters: int = 32  # trainer validation micro-batches (x micro batch 4 = 128 sequences of 256 tokens)
    eval_sequences: int = 32  # evaluator sequences per task (passkey: per cell)
    passkey_lengths: tuple[int, ...] = (64, 256, 512, 1024)
    passkey_depths: tuple[float, ...] = (0.0, 0.5, 1.0)
    warmup_iters: int = 50
    val_all: bool = True  # the val and cache tasks score every validation sample (not --limit)

    @classmethod
    def smoke(cls) -> StudySettings:
        """Three arms at the tiny scale, 2 seeds, a few steps: exercises the whole pipeline in CI."""
        return cls(arms=("baseline", "mixture", "sentinel"), seeds=(1, 2), scales=("tiny",), iters={"tiny": 8},
                   eval_interval=4, eval_iters=2, eval_sequences=4, passkey_lengths=(64, 128), passkey_depths=(0.5,),
                   warmup_iters=2, val_all=False, scale_arms={}, scale_seeds={})

    def arms_at(self, scale: str) -> tuple[str, ...]:
        """The arms a scale runs (the baseline first)."""
        return tuple(a for a in self.scale_arms.get(scale, self.arms) if a in self.arms)

    def seeds_at(self, scale: str) -> tuple[int, ...]:
        return tuple(self.scale_seeds.get(scale, self.seeds))

    def grid(self) -> list[tuple[str, str, int]]:
        """(scale, arm, seed) of every run of these settings."""
        return [(sc, a, s) for sc in self.scales for a in self.arms_at(sc) for s in self.seeds_at(sc)]

    def planned(self) -> list[tuple[str, str, int]]:
        """(scale, arm, seed) of the planned grid (the default settings): what `provisional` is measured against."""
        return StudySettings().grid()

    def scale(self, name: str) -> Scale:
        base = SCALES[name]
        return Scale(base.name, base.hidden, base.layers, base.vocab, self.iters.get(name, base.iters),
                     self.eval_interval or base.eval_interval)

    def validate(self) -> None:
        """ValueError naming the bad setting."""
        unknown = [a for a in self.arms if a not in ARMS] + [s for s in self.scales if s not in SCALES]
        if unknown:
            raise ValueError(f"unknown arm(s)/scale(s) {unknown}; arms: {', '.join(ARMS)}; scales: {', '.join(SCALES)}")
        if "baseline" not in self.arms or len(self.arms) < 2:
            raise ValueError("the study compares CPLM arms with the baseline: --arms must hold baseline and >= 1 other")
        for name in self.scales:
            if "baseline" not in self.arms_at(name) or len(self.arms_at(name)) < 2:
                raise ValueError(f"scale {name} runs arms {list(self.arms_at(name))}: it needs the baseline and >= 1 "
                                 f"other of --arms")
            if len(set(self.seeds_at(name))) < 2:
                raise ValueError(f"a spread needs >= 2 distinct seeds, got {list(self.seeds_at(name))} at scale {name}")
        for name in self.scales:
            scale = self.scale(name)
            if scale.iters < 1 or scale.eval_interval < 1 or scale.iters % scale.eval_interval:
                raise ValueError(f"scale {name}: iters={scale.iters} must be a positive multiple of the eval interval "
                                 f"{scale.eval_interval} (the last step must be evaluated)")


def run_name(scale: str, arm: str, seed: int) -> str:
    return f"{scale}-{arm}-s{seed}"


def corpus_dirs(settings: StudySettings, data_root: Path) -> dict[str, Path]:
    """Corpus directory per scale (vocabulary 4096: `<root>/stdlib`, else `<root>/stdlib_v<V>`)."""
    return {name: Path(data_root) / settings.scale(name).corpus for name in settings.scales}


def ensure_corpora(settings: StudySettings, data_root: Path, log: Callable[[str], None] = print) -> dict[str, Path]:
    """Build the corpora the scales need (idempotent: a built corpus is confirmed, not rebuilt)."""
    from cplm_megatron.data.stdlib_corpus import build_stdlib_corpus

    dirs = corpus_dirs(settings, data_root)
    for name, path in dirs.items():
        if not all((path / split / "manifest.json").is_file() for split in ("train", "dev", "val")):
            log(f"[study] building the embedded corpus with vocabulary {settings.scale(name).vocab} in {path}")
        build_stdlib_corpus(path, vocab_size=settings.scale(name).vocab, seq_len=SEQ_LEN, show_progress=False)
    return dirs


def study_runs(settings: StudySettings, corpora: dict[str, Path]) -> list[Run]:
    """Every run of the study, scale by scale and seed by seed (a seed's arms finish together)."""
    settings.validate()
    from cplm_megatron.data.manifest import read_manifest

    runs: list[Run] = []
    for scale_name in settings.scales:
        scale = settings.scale(scale_name)
        data = Path(corpora[scale_name]).resolve()
        manifest = read_manifest(str(data / "train"))
        if (manifest.tokenizer.vocab_size, manifest.seq_len) != (scale.vocab, SEQ_LEN):
            raise ValueError(f"{data} has vocabulary {manifest.tokenizer.vocab_size} and seq_len {manifest.seq_len}; "
                             f"scale {scale_name} needs {scale.vocab} and {SEQ_LEN}")
        checkpoint_interval = max(scale.eval_interval, (scale.iters // 4) // scale.eval_interval * scale.eval_interval)
        common: dict[str, Value] = {
            "logging.wandb": False, "model.hidden_size": scale.hidden, "model.num_layers": scale.layers,
            "model.vocab_size": scale.vocab, "model.max_position_embeddings": MAX_POSITIONS,
            "data.streams": [data / "train"], "data.val_streams": [data / "val"],
            "train.iters": scale.iters, "train.seq_len": SEQ_LEN, "train.micro_batch": MICRO_BATCH,
            "train.global_batch": GLOBAL_BATCH, "train.eval_interval": scale.eval_interval,
            "train.eval_iters": settings.eval_iters, "train.log_interval": scale.eval_interval,
            "schedule.warmup_iters": settings.warmup_iters,
            "checkpoint.interval": checkpoint_interval, "checkpoint.keep": 1,
        }
        for seed in settings.seeds_at(scale_name):
            for arm_name in settings.arms_at(scale_name):
                arm = ARMS[arm_name]
                labels: dict[str, Any] = {"arm": arm_name, "scale": scale_name, "seed": seed, "hidden": scale.hidden,
                                          "layers": scale.layers, "vocab": scale.vocab, "iters": scale.iters,
                                          "copy_head": arm.copy_head}
                # the cache control is the baseline's (an evaluation-only arm); every run gets val over all samples
                tasks = ("val", "copy", "passkey", "gradient") + (("cache",) if not arm.copy_head else ())
                evaluation = Evaluation(tasks, limit=settings.eval_sequences, gradient_source="val",
                                        data=str(data / "val"), dev_data=str(data / "dev"), copy_length=128,
                                        val_all=settings.val_all, passkey_lengths=tuple(settings.passkey_lengths),
                                        passkey_depths=tuple(settings.passkey_depths), every_checkpoint=False)
                runs.append(Run(
                    run_name(scale_name, arm_name, seed), f"{scale_name}-s{seed}",
                    (("copy_head.enabled", arm.copy_head), *common.items(), ("run.seed", seed), ("data.seed", seed),
                     *arm.settings),
                    evaluation, tuple(sorted(labels.items())), experiment="study"))
    return runs
