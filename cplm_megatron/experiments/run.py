"""Experiments as data: a run is a recipe, its settings, its evaluation and its labels. The ablation
(ablation.py), the recipe study (study.py), the study on SLURM (cluster.py) and the scaling sweep (scaling.py) are
plans over this one type. How runs are launched: launch/; what they leave: records.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

Value = Any  # an override's value: bool, int, float, str, None, a Path, or a list/tuple of those


def set_text(value: Value) -> str:
    """A value as the trainer's `--set KEY=VALUE` text: true/false, null, floats as %g, lists as [a,b]."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(set_text(v) for v in value) + "]"
    return str(value)


def set_arguments(settings: Sequence[tuple[str, Value]]) -> list[str]:
    """(dotted key, value) settings as the trainer's `--set KEY=VALUE` arguments."""
    return [f"{key}={set_text(value)}" for key, value in settings]


@dataclass(frozen=True)
class Evaluation:
    """How a run's checkpoints are evaluated (`python -m cplm_megatron.evaluate`); None: the evaluator's default."""

    tasks: tuple[str, ...]
    limit: int | None = None  # sequences per task (passkey: per cell)
    gradient_source: str | None = None
    data: str | None = None  # validation split (default: the run's data.val_streams)
    dev_data: str | None = None
    copy_length: int | None = None
    val_all: bool = False  # val and cache score every validation sample
    passkey_lengths: tuple[int, ...] | None = None
    passkey_depths: tuple[float, ...] | None = None
    spamlang_length: int | None = None
    every_checkpoint: bool = True  # every checkpoint and the untrained model (False: the last one)

    def args(self) -> list[str]:
        """The evaluator's options besides --checkpoint/--output."""
        out = ["--tasks", ",".join(self.tasks)]
        for flag, value in (("--limit", self.limit), ("--gradient-source", self.gradient_source),
                            ("--data", self.data), ("--dev-data", self.dev_data), ("--copy-length", self.copy_length),
                            ("--spamlang-length", self.spamlang_length)):
            if value is not None:
                out += [flag, str(value)]
        if self.val_all:
            out.append("--val-all")
        if self.passkey_lengths is not None:
            out += ["--passkey-lengths", ",".join(map(str, self.passkey_lengths))]
        if self.passkey_depths is not None:
            out += ["--passkey-depths", ",".join(f"{d:g}" for d in self.passkey_depths)]
        if self.every_checkpoint:
            out += ["--all-checkpoints", "--include-initial"]
        return out


@dataclass(frozen=True)
class Run:
    """One training run and its evaluation: `recipe` (a shipped recipe's name or a file) with `settings` applied
    in order, evaluated as `evaluation`; `labels` are the facts a report groups by (arm, seed, vocab, ...)."""

    name: str  # directory name under <output>/runs
    group: str  # runs compared with each other (an ablation pair, a study's seed)
    settings: tuple[tuple[str, Value], ...]  # (dotted config key, value), copy_head.enabled among them
    evaluation: Evaluation
    labels: tuple[tuple[str, Any], ...] = ()
    recipe: str = "tiny"
    experiment: str = ""  # "corpus" | "spamlang" | "study"

    @property
    def label(self) -> dict[str, Any]:
        return dict(self.labels)

    @property
    def copy_head(self) -> bool:
        return bool(dict(self.settings)["copy_head.enabled"])

    def overrides(self) -> list[str]:
        """The settings as the trainer's `--set KEY=VALUE` arguments."""
        return set_arguments(self.settings)

    def with_settings(self, *settings: tuple[str, Value]) -> Run:
        """This run with more settings applied after its own."""
        return replace(self, settings=(*self.settings, *settings))

