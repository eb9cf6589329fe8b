"""The package's layers import one way (an ast scan of every import in cplm_megatron/, TYPE_CHECKING and
function-level imports included): config and errors at the bottom; data, kernels and parallel never import the
layers above them; model never imports training, evaluation, hf or experiments; training never imports
evaluation, hf or experiments; evaluation never imports experiments."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cplm_megatron"
UPPER = {"model", "training", "evaluation", "hf", "experiments"}
FORBIDDEN = {
    "config": UPPER | {"data", "parallel"},
    "errors": UPPER | {"data", "parallel", "config"},
    "data": UPPER,
    "parallel": UPPER,
    "model": UPPER - {"model"},
    "training": {"evaluation", "hf", "experiments"},
    "evaluation": {"experiments"},
}


def imported_layers_of(path: Path, here: tuple = ()) -> list[tuple[int, str]]:
    """(line, layer) of every `cplm_megatron.<layer>` import in a module (relative imports resolved against
    `here`, the module's dotted parts)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x / from ..model import y
                base = list(here[: len(here) - node.level])
                names = [".".join(base + ([node.module] if node.module else []))]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cplm_megatron" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


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
