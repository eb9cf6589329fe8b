"""The experiment registry: name -> its `Experiment` (settings, plan, run, report and its command line).

Every package under cplm_megatron/experiments/ with a module `experiment` that defines `EXPERIMENT` is an
experiment (ablation/, study/, emergence/, scaling/, long_context/, gpu_study/): adding one is one package; the
CLI (`python -m cplm_megatron.experiments NAME ...`) and the pipeline (pipeline.py) find it by name. Nothing else
branches on an experiment's name. `register_experiment` adds one from elsewhere (a plugin, a test).
"""
from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import import_module, util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cplm_megatron.errors import UserError

if TYPE_CHECKING:
    from cplm_megatron.experiments.launch.launcher import JobResult

PACKAGE = "cplm_megatron.experiments"
SPEC_MODULE = "experiment"  # the module of an experiment package that declares EXPERIMENT


@dataclass
class Context:
    """Where and how an experiment runs: its output directory, its data (a corpus, or the root its corpora are
    built under), runs at a time, threads per run, processes per run, and what it prints."""

    output: Path
    data: Path | None = None
    jobs: int = 1
    threads: int = 1
    processes: int = 1
    backend: str = "warm"
    command: str = ""  # the command line, as the report records it
    on_done: Callable[[JobResult], None] | None = None
    log: Callable[[str], None] = print
    progress_every: float = 0.0  # > 0: the running jobs' progress lines this often


@dataclass(frozen=True)
class Experiment:
    """An experiment as the CLI and the pipeline see it (torchtitan's TrainSpec for experiments)."""

    name: str
    about: str  # one line: what it asks
    settings: type  # its settings dataclass (defaults: the full experiment)
    plan: Callable[[Any, Context], list]  # the runs (or jobs) the settings ask for; nothing trained
    run: Callable[[Any, Context], Any]  # train and evaluate what has not finished (finished runs reused), report
    report: Callable[[Any, Context], Any]  # the report of the runs finished so far; trains nothing
    main: Callable[[list[str] | None], int] | None = None  # its own command line (argv -> exit code); None: the
    # common one (__main__.py: --output, --data, --variant, --jobs, --report-only, --plan)
    package: str = field(default="", compare=False)  # the package it was found in ("": registered)


_registered: dict[str, Experiment] = {}
_scanned: dict[str, Experiment] | None = None


def register_experiment(experiment: Experiment) -> None:
    """Add `experiment` to the registry; ValueError when its name is taken by another."""
    known = registry()
    if experiment.name in known and known[experiment.name] != experiment:
        raise ValueError(f"an experiment named {experiment.name!r} is registered already "
                         f"({known[experiment.name].package or 'by register_experiment'})")
    _registered[experiment.name] = experiment


def scan(package: str = PACKAGE) -> dict[str, Experiment]:
    """name -> experiment, from every subpackage of `package` whose `experiment` module defines EXPERIMENT."""
    found: dict[str, Experiment] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(import_module(package).__path__) if m.ispkg):
        name = f"{package}.{module}.{SPEC_MODULE}"
        if util.find_spec(name) is None:
            continue
        spec = getattr(import_module(name), "EXPERIMENT", None)
        if isinstance(spec, Experiment):
            if spec.name in found:
                raise ValueError(f"experiments {found[spec.name].package} and {module} are both named {spec.name!r}")
            found[spec.name] = replace(spec, package=f"{package}.{module}")
    return found


def registry(rescan: bool = False) -> dict[str, Experiment]:
    """Every experiment: the scanned packages' and the registered ones (`rescan`: look at the packages again)."""
    global _scanned
    if _scanned is None or rescan:
        _scanned = scan()
    return {**_scanned, **_registered}


def known_experiments() -> list[str]:
    """The experiments' names, sorted."""
    return sorted(registry())


def experiment(name: str) -> Experiment:
    """The experiment `name`; an unknown one is one UserError line naming the known ones."""
    found = registry().get(name)
    if found is None:
        raise UserError(f"unknown experiment {name!r}; known experiments: {', '.join(known_experiments())}")
    return found
