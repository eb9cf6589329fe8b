"""Reading and checking a config imports no torch, megatron-core, Triton or the copy kernels: every shipped recipe and
model preset loads and validates in a fresh process without them, and the trainer's `--print-config` and `--check`
answer (through `python -m`, as users run them) without them. What depends on the machine is checked where the model
is built (test_copy_head.py: the fused kernel's head dims)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "megatron", "triton", "cplm_kernels", "transformer_engine")
# Prints, at the interpreter's exit (after the entry point's sys.exit), the heavy packages this process imported.
REPORT = (f"import atexit, json, sys; atexit.register(lambda: print('HEAVY=' + json.dumps(sorted("
          f"{{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))), file=sys.stderr))")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter outside any launcher (RANK/WORLD_SIZE/SLURM_* only as given)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**base, **env}, timeout=120)


def _heavy(stderr: str) -> list:
    lines = [line for line in stderr.splitlines() if line.startswith("HEAVY=")]
    assert len(lines) == 1, stderr
    return json.loads(lines[0].removeprefix("HEAVY="))


def test_every_shipped_recipe_and_preset_loads_and_validates_without_torch():
    code = REPORT + """
from cplm_megatron.config.loader import shipped_recipes
from cplm_megatron.model.config import available_presets, load_preset
from cplm_megatron.run_config import load_run_config

for name in shipped_recipes():
    load_run_config(name).validate()
for name in available_presets():
    load_run_config(None, [f"model.preset={name}"]).validate()
    load_preset(name).validate()
print(json.dumps([shipped_recipes(), available_presets()]))
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    recipes, presets = json.loads(proc.stdout)
    assert recipes == sorted(p.stem for p in (REPO / "configs").glob("*.yaml")) and "tiny" in recipes
    assert presets == sorted(p.stem for p in (REPO / "configs" / "models").glob("*.yaml")) and "tiny" in presets
    assert _heavy(proc.stderr) == []


def _pretrain(*args: str, **env: str) -> subprocess.CompletedProcess:
    """`python -m cplm_megatron.pretrain ARGS`, reporting the heavy packages it imported."""
    run = f"import runpy; sys.argv = ['pretrain', *{list(args)!r}]; runpy.run_module('cplm_megatron.pretrain', " \
          "run_name='__main__')"
    return _python(REPORT + "\n" + run, **env)


def test_print_config_and_check_answer_without_torch():
    printed = _pretrain("--config", "tiny", "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert "preset: tiny" in printed.stdout and _heavy(printed.stderr) == []

    checked = _pretrain("--config", "tiny", "--check", "--set", "parallel.tp=2", RANK="0", WORLD_SIZE="4")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("config ok: 4 process(es) as tp=2 pp=1 cp=1 dp=2; 40 iterations of 8 x 256")
    assert _heavy(checked.stderr) == []


def test_check_refuses_a_layout_that_does_not_fit_the_launch_without_torch():
    """The checks that need the number of processes run too: 3 processes cannot hold tp=2 (exit 2, one line)."""
    refused = _pretrain("--config", "tiny", "--check", "--set", "parallel.tp=2", RANK="0", WORLD_SIZE="3")
    assert refused.returncode == 2 and refused.stdout == ""
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "world size 3 is not divisible by parallel.tp" in errors[0], refused.stderr
    assert _heavy(refused.stderr) == []
