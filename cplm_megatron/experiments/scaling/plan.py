"""The scaling sweep's grid: model size x node count x parallel layout x copy head (submitted by sweep.py).

Layouts are written tp<N>pp<M>[vpp<K>][sp], e.g. tp1pp1, tp2pp1sp, tp4pp2vpp4sp.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from cplm_megatron.experiments.launch.launcher import recipe_of
from cplm_megatron.experiments.run import Evaluation, Run, Value, set_arguments

SIZES = ("135m", "360m", "1p7b", "7b", "13b")  # <slurm_dir>/pretrain_<size>.sh
DEFAULT_TASKS_PER_NODE = 8  # the scripts' --ntasks-per-node (one task per GPU)
_LAYOUT = re.compile(r"^tp(\d+)pp(\d+)(?:vpp(\d+))?(sp)?$")


class StudyError(ValueError):
    """A sweep specification that cannot be submitted."""


@dataclass(frozen=True)
class SweepLayout:
    """Model-parallel sizes of one run; data parallelism is what the world size leaves."""

    tp: int
    pp: int
    vpp: int | None
    sp: bool

    @classmethod
    def parse(cls, text: str) -> SweepLayout:
        m = _LAYOUT.match(text)
        if not m:
            raise StudyError(f"layout {text!r} is not tp<N>pp<M>[vpp<K>][sp] (e.g. tp2pp1sp, tp4pp2vpp4sp)")
        tp, pp = int(m.group(1)), int(m.group(2))
        vpp = int(m.group(3)) if m.group(3) else None
        if tp < 1 or pp < 1 or (vpp is not None and (vpp < 1 or pp < 2)) or (m.group(4) and tp < 2):
            raise StudyError(f"layout {text!r}: need tp, pp >= 1, vpp only with pp >= 2, sp only with tp >= 2")
        return cls(tp, pp, vpp, bool(m.group(4)))

    @property
    def name(self) -> str:
        return f"tp{self.tp}pp{self.pp}" + (f"vpp{self.vpp}" if self.vpp else "") + ("sp" if self.sp else "")

    def settings(self) -> tuple[tuple[str, Value], ...]:
        return (("parallel.tp", self.tp), ("parallel.pp", self.pp), ("parallel.vpp", self.vpp or None),
                ("parallel.sp", self.sp))

    def overrides(self) -> list[str]:
        """The settings as `--set` text."""
        return set_arguments(self.settings())


@dataclass(frozen=True)
class Combination:
    """One run of the study."""

    size: str
    nodes: int
    layout: SweepLayout
    copy_head: bool

    @property
    def name(self) -> str:
        return f"{self.size}-n{self.nodes}-{self.layout.name}-{'cplm' if self.copy_head else 'base'}"

    def script(self, slurm_dir: Path) -> Path:
        """The size's SLURM script (its recipe and #SBATCH directives) in a checkout's slurm/ directory."""
        return Path(slurm_dir) / f"pretrain_{self.size}.sh"

    def run(self, iters: int, extra: Sequence[str] = ()) -> Run:
        """The combination as a run: the study's settings, then the user's `KEY=VALUE` (later wins); no evaluation,
        no checkpoints, no periodic validation: a throughput measurement."""
        settings = (("copy_head.enabled", self.copy_head), *self.layout.settings(), ("train.tokens", None),
                    ("train.iters", iters), ("train.eval_interval", 0), ("checkpoint.interval", 0),
                    *(tuple(item.split("=", 1)) for item in extra))
        return Run(self.name, f"{self.size}-{self.layout.name}", settings, Evaluation(()),
                   (("copy_head", self.copy_head), ("nodes", self.nodes), ("size", self.size)), experiment="scaling")


def plan(layouts: dict[str, list[SweepLayout]], nodes: Sequence[int], copy_heads: Sequence[bool],
         tasks_per_node: int) -> tuple[list[Combination], list[tuple[Combination, str]]]:
    """(combinations to run, [(combination, why it is skipped)]) in submission order; `layouts` maps
    each model size to the layouts it is run with."""
    runnable, skipped = [], []
    for size, n, head in product(layouts, nodes, copy_heads):
        for layout in layouts[size]:
            combo = Combination(size, n, layout, head)
            world = n * tasks_per_node
            if world % (layout.tp * layout.pp):
                skipped.append((combo, f"world size {world} is not divisible by tp*pp={layout.tp * layout.pp}"))
            else:
                runnable.append(combo)
    return runnable, skipped


def recipe_layout(size: str, slurm_dir: Path) -> SweepLayout:
    """The parallel layout of the recipe <slurm_dir>/pretrain_<size>.sh runs."""
    import yaml

    from cplm_megatron.config.loader import recipe_path

    recipe = Path(recipe_path(recipe_of(Path(slurm_dir) / f"pretrain_{size}.sh", StudyError)))
    par = (yaml.safe_load(recipe.read_text()) or {}).get("parallel") or {}
    return SweepLayout(int(par.get("tp", 1)), int(par.get("pp", 1)), par.get("vpp"), bool(par.get("sp", False)))
