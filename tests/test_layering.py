"""The package's layers import one way (an ast scan of every import in cplm_megatron/, TYPE_CHECKING and
function-level imports included): config, errors and durable_files at the bottom; data, kernels and parallel
never import the layers above them; model never imports checkpoint, training, evaluation, hf or experiments;
the run config and checkpoint never import training, evaluation, hf or experiments; training never imports
evaluation, hf or experiments; evaluation and hf never import training (they read runs through the run config
and checkpoint); evaluation never imports experiments. Inside model/, no import circle; inside experiments/, the shared toolkit
(run, records, launch, toolkit) sits below the experiments (ablation, study, scaling), which never import each other,
and the pipeline and entry points sit on top. benchmarks/ sits above it all: it imports cplm_megatron and cplm_kernels,
nothing in them, tools/ or pretrain/ imports it, and its modules import each other as `benchmarks.*` (no sys.path
edits)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cplm_megatron"
UPPER = {"model", "checkpoint", "training", "evaluation", "hf", "experiments"}
FORBIDDEN = {
    "config": UPPER | {"data", "parallel"},
    "errors": UPPER | {"data", "parallel", "config"},
    "durable_files": UPPER | {"data", "parallel", "config"},
    "data": UPPER,
    "parallel": UPPER,
    "model": UPPER - {"model"},
    "run_config": {"checkpoint", "training", "evaluation", "hf", "experiments"},
    "checkpoint": {"training", "evaluation", "hf", "experiments"},
    "training": {"evaluation", "hf", "experiments"},
    "evaluation": {"training", "experiments"},
    "hf": {"training", "evaluation", "experiments"},
}


def imported_names(path: Path, here: tuple | None = ()) -> list[tuple[int, str]]:
    """(line, module) of every import in a file (TYPE_CHECKING and function-level ones too); relative imports
    resolved against `here`, the module's dotted parts, or left out where `here` is None."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level and here is not None:  # from . import x / from ..m import y
            base = list(here[: len(here) - node.level])
            found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module))
    return found


def imported_layers_of(path: Path, here: tuple = ()) -> list[tuple[int, str]]:
    """(line, layer) of every `cplm_megatron.<layer>` import in a module (relative imports resolved against
    `here`, the module's dotted parts)."""
    return [(line, name.split(".")[1]) for line, name in imported_names(path, here)
            if name.split(".")[0] == "cplm_megatron" and "." in name]


def imported_layers(path: Path) -> list[tuple[int, str]]:
    """imported_layers_of for a module of the package."""
    return imported_layers_of(path, path.relative_to(PACKAGE.parent).with_suffix("").parts)


def layer_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        for line, target in imported_layers(path):
            if target in FORBIDDEN.get(layer, set()):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {layer} imports {target}")
    return out


def test_layers_import_one_way():
    assert violations() == []


def test_kernels_import_nothing_of_the_project():
    """cplm_kernels sits below everything: the model layer calls it, never the reverse."""
    kernels = PACKAGE.parent / "cplm_kernels"
    imports = [(p.name, line) for p in sorted(kernels.rglob("*.py")) for line, _ in imported_layers_of(p)]
    assert imports == []


def test_the_scan_sees_type_checking_function_level_and_relative_imports(tmp_path: Path, monkeypatch):
    """The rule would fail on what it is meant to catch (the parallel -> model import it replaced)."""
    fake = tmp_path / "cplm_megatron"
    (fake / "parallel").mkdir(parents=True)
    (fake / "parallel" / "config.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cplm_megatron.model.config import ModelConfig\n"
        "def f():\n    from ..training import trainer\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", fake)
    assert violations() == ["cplm_megatron/parallel/config.py:3: parallel imports model",
                            "cplm_megatron/parallel/config.py:5: parallel imports training"]


def module_imports(package: Path, root: Path) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (ast scan: TYPE_CHECKING and function-level imports too;
    `from pkg import name` counts as importing pkg.name when that is a module, else pkg)."""
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + [node.module] if node.level else [node.module]) \
                    if node.module or node.level else ""
                if node.level and not node.module:
                    base = ".".join(here[: len(here) - node.level + 1])
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, each once (as found by a depth-first search from its smallest module)."""
    found = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def test_no_import_circle_in_the_model_package():
    """cplm_megatron/model/ imports one way inside too: the planner sits above accounting and step_time, and
    the backbones read a model's shape (a Protocol) instead of importing the config module that registers them."""
    graph = module_imports(PACKAGE / "model", PACKAGE.parent)
    assert "cplm_megatron.model.sizing.planner" in graph and graph["cplm_megatron.model.backbones.base"] is not None
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_type_only_circle(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert cycles(module_imports(pkg, tmp_path)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


# cplm_megatron/experiments/ inside: the shared toolkit below the experiments, each experiment its own package
# (none imports another), the pipeline and the entry points above them
EXPERIMENT_RANKS = {"run": 0, "records": 1, "launch": 2, "toolkit": 3, "paired": 3, "progress": 3, "registry": 3,
                    "ablation": 4, "study": 4, "scaling": 4, "long_context": 4, "gpu_study": 4, "pipeline": 5,
                    "emergence": 5, "cli": 6, "demo": 6, "__main__": 6}


def experiment_violations(package: Path) -> list[str]:
    """Imports inside an experiments package that run up or sideways (unit: the module or subpackage under it)."""
    graph = module_imports(package, package.parents[1])
    prefix = f"{package.parent.name}.{package.name}."
    unit = {name: name.removeprefix(prefix).split(".")[0] for name in graph if name.startswith(prefix)}
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit.get(name), unit.get(target)
            if a is None or b is None or a == b:
                continue
            if a not in EXPERIMENT_RANKS or b not in EXPERIMENT_RANKS:
                out.append(f"{name} -> {target}: {a if a not in EXPERIMENT_RANKS else b} has no rank")
            elif EXPERIMENT_RANKS[b] >= EXPERIMENT_RANKS[a]:
                out.append(f"{name} -> {target}")
    return out


def test_experiments_import_one_way_inside():
    assert experiment_violations(PACKAGE / "experiments") == []


def test_an_experiment_importing_another_is_caught(tmp_path: Path):
    pkg = tmp_path / "cplm_megatron" / "experiments"
    for sub in ("study", "ablation"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "run.py").write_text("from cplm_megatron.experiments.records import x\n")
    (pkg / "records.py").write_text("")
    (pkg / "study" / "plan.py").write_text("from cplm_megatron.experiments.ablation import report\n")
    (pkg / "ablation" / "report.py").write_text("from cplm_megatron.experiments import run\n")
    assert experiment_violations(pkg) == ["cplm_megatron.experiments.run -> cplm_megatron.experiments.records",
                                          "cplm_megatron.experiments.study.plan -> "
                                          "cplm_megatron.experiments.ablation.report"]


# benchmarks/ on top: a package (its modules run as `python -m benchmarks.NAME`) that imports the project, which never
# imports it; its modules reach each other as `benchmarks.*`, never through a sys.path edit
BENCHMARKS = PACKAGE.parent / "benchmarks"
BELOW_BENCHMARKS = ("cplm_megatron", "cplm_kernels", "tools", "pretrain")


def benchmark_violations(root: Path) -> list[str]:
    """The project (cplm_megatron, cplm_kernels, tools/, pretrain/) importing `benchmarks`; a benchmark importing a
    sibling by its bare name (reachable only through a sys.path edit) or touching sys.path."""
    benchmarks = root / "benchmarks"
    siblings = {p.stem for p in benchmarks.rglob("*.py")} - {"__init__"}
    out = [f"{path.relative_to(root)}:{line}: imports {name}"
           for top in BELOW_BENCHMARKS for path in sorted((root / top).rglob("*.py"))
           for line, name in imported_names(path, None) if name.split(".")[0] == "benchmarks"]
    for path in sorted(benchmarks.rglob("*.py")):
        rel = path.relative_to(root)
        out += [f"{rel}:{line}: imports {name} by its bare name" for line, name in imported_names(path, None)
                if name.split(".")[0] in siblings]
        out += [f"{rel}:{node.lineno}: touches sys.path" for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"]
    return out


def test_benchmarks_sit_above_the_project():
    """Every benchmark imports its siblings as `benchmarks.*` and the project as users do; nothing of the project
    imports a benchmark; no import circle among the benchmarks."""
    assert benchmark_violations(PACKAGE.parent) == []
    tops = {name.split(".")[0] for path in BENCHMARKS.rglob("*.py") for _, name in imported_names(path, None)}
    assert {"benchmarks", "cplm_megatron", "cplm_kernels"} <= tops, sorted(tops)
    graph = module_imports(BENCHMARKS, PACKAGE.parent)
    assert {"benchmarks.ratios", "benchmarks.gpu.gpu_steps"} <= set(graph) and cycles(graph) == []


def test_the_benchmark_scan_sees_upward_imports_bare_siblings_and_path_edits(tmp_path: Path):
    """The rule would fail on what it is meant to catch: the project importing a benchmark (function-level too),
    a benchmark's `from common import` and its `sys.path.insert`."""
    for folder in (*BELOW_BENCHMARKS, "benchmarks/gpu"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "benchmarks" / "common.py").write_text("import torch\n")
    (tmp_path / "benchmarks" / "gpu" / "step.py").write_text(
        "import sys\nsys.path.insert(0, '..')\nfrom common import sync\nfrom benchmarks.common import sync\n")
    (tmp_path / "cplm_megatron" / "model.py").write_text("def f():\n    from benchmarks.gpu import step\n")
    assert benchmark_violations(tmp_path) == ["cplm_megatron/model.py:2: imports benchmarks.gpu",
                                              "benchmarks/gpu/step.py:3: imports common by its bare name",
                                              "benchmarks/gpu/step.py:2: touches sys.path"]
