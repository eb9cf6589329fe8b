"""The experiment registry: every experiment package is found by scanning, and one added in a package of its own
(written here to a temporary directory on the experiments package's path) runs through the one command line."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import cplm_megatron.experiments as experiments_package
from cplm_megatron.experiments import registry
from cplm_megatron.experiments.__main__ import main

TINY = '''
"""A tiny experiment: N runs of the tiny recipe that differ in their seed; its report lists them."""
import json
from dataclasses import dataclass

from cplm_megatron.experiments.registry import Context, Experiment
from cplm_megatron.experiments.run import Evaluation, Run, set_arguments


@dataclass
class TinySettings:
    seeds: tuple = (1, 2, 3)

    @classmethod
    def smoke(cls):
        return cls(seeds=(7,))


def plan(settings, ctx):
    return [Run(f"tiny-s{s}", "tiny", (("run.seed", s), ("train.iters", 2)), Evaluation(("val",)))
            for s in settings.seeds]


def report(settings, ctx):
    path = ctx.output / "report.json"
    runs = {r.name: set_arguments(r.settings) for r in plan(settings, ctx) if (ctx.output / "runs" / r.name).is_dir()}
    path.write_text(json.dumps({"runs": runs, "command": ctx.command}))
    return path


def run(settings, ctx):
    for r in plan(settings, ctx):
        (ctx.output / "runs" / r.name).mkdir(parents=True, exist_ok=True)
    return report(settings, ctx)


EXPERIMENT = Experiment("tiny", "a tiny experiment (tests/experiments/test_registry.py)", TinySettings, plan=plan,
                        run=run, report=report)
'''


@pytest.fixture
def tiny_package(tmp_path: Path, monkeypatch) -> Path:
    """A package `tinyexp` holding the tiny experiment, on cplm_megatron.experiments' path; the registry rescans."""
    extra = tmp_path / "extra"
    (extra / "tinyexp").mkdir(parents=True)
    (extra / "tinyexp" / "__init__.py").write_text("")
    (extra / "tinyexp" / "experiment.py").write_text(textwrap.dedent(TINY))
    monkeypatch.setattr(experiments_package, "__path__", [*experiments_package.__path__, str(extra)])
    monkeypatch.setattr(registry, "_scanned", None)
    return tmp_path


def test_every_shipped_experiment_is_found_by_scanning():
    found = registry.registry(rescan=True)
    assert {"ablation", "study", "emergence", "scaling", "long_context", "gpu_study"} <= set(found)
    for name, spec in found.items():
        assert spec.package == f"cplm_megatron.experiments.{spec.package.rsplit('.', 1)[1]}" and spec.name == name


def test_an_experiment_added_in_one_package_runs_through_the_cli(tiny_package: Path, capsys):
    out = tiny_package / "out"
    assert "tiny" in registry.known_experiments()
    assert main(["tiny", "--output", str(out), "--plan"]) == 0
    assert capsys.readouterr().out.split() == ["tiny-s1", "tiny-s2", "tiny-s3"]
    assert main(["tiny", "--output", str(out), "--variant", "smoke"]) == 0
    assert f"[tiny] report: {out / 'report.json'}" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert report == {"runs": {"tiny-s7": ["run.seed=7", "train.iters=2"]},
                      "command": f"python -m cplm_megatron.experiments tiny --output {out} --variant smoke"}
    assert main(["tiny", "--output", str(out), "--report-only"]) == 0  # the defaults' runs: none finished
    assert json.loads((out / "report.json").read_text())["runs"] == {}
    assert main(["--list"]) == 0 and "tiny         a tiny experiment" in capsys.readouterr().out


def test_bad_names_are_one_line_and_exit_2(tiny_package: Path, capsys):
    assert main(["tinny", "--output", "x"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: unknown experiment 'tinny'; known experiments: {', '.join(registry.known_experiments())}"]
    assert main(["tiny", "--output", "x", "--variant", "huge"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --variant 'huge': tiny's settings have no such variant; known: smoke"]


def test_a_second_experiment_of_the_same_name_is_refused(tiny_package: Path):
    tiny = registry.experiment("tiny")
    registry.register_experiment(tiny)  # the same one again: nothing changes
    with pytest.raises(ValueError, match="an experiment named 'tiny' is registered already"):
        registry.register_experiment(registry.Experiment("tiny", "another", dict, plan=tiny.plan, run=tiny.run,
                                                         report=tiny.report))


def test_the_command_lists_every_experiment_as_users_run_it():
    """`python -m cplm_megatron.experiments --list` in a process of its own: every shipped experiment, quickly (the
    scan imports no torch)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['x', '--list']; "
                           "runpy.run_module('cplm_megatron.experiments', run_name='__main__'); "
                           "assert 'torch' not in sys.modules, 'the scan imported torch'"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[0] for line in proc.stdout.splitlines() if line.strip()] == [
        "ablation", "emergence", "gpu_study", "long_context", "scaling", "study"]
