"""The README's commands stay runnable: every tool flag it shows exists, every recipe + `--set` line (direct or
through an sbatch script) resolves to a valid config, every make target exists. (The commands themselves run
elsewhere: `make demo`/`make test` in CI, training/SLURM/conversion in their own tests.)"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from cplm_megatron.training.run_config import load_run_config, overrides_from_args

REPO = Path(__file__).resolve().parents[1]
SHELL_VALUES = {"$copy": "true"}  # loop variables in the README's examples


def readme_commands() -> list[list[str]]:
    """Each command line of the README's bash blocks (continuations joined, comments and [optional] parts dropped)."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split(" #")[0]).strip()
            for var, value in SHELL_VALUES.items():
                line = line.replace(var, value)
            if line and not line.startswith(("for ", "done", "#")):
                commands.append(shlex.split(line))
    return commands


@lru_cache(maxsize=None)
def tool_help(script: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def pretrain_args(cmd: list[str]) -> list[str] | None:
    """The pretrain_cplm.py arguments of a direct or sbatch training command, recipe first; None otherwise."""
    for i, word in enumerate(cmd):
        if word.endswith("pretrain/pretrain_cplm.py"):
            return cmd[i + 1:]
        if word.startswith("slurm/pretrain_") and word.endswith(".sh"):
            recipe = re.search(r"^recipe=(\S+)", (REPO / word).read_text(), flags=re.M).group(1)
            return ["--config", recipe, *cmd[i + 1:]]
    return None


def test_readme_has_the_two_commands_and_they_are_make_targets():
    commands = readme_commands()
    assert ["make", "demo"] in commands and ["make", "test"] in commands
    makefile = (REPO / "Makefile").read_text()
    for cmd in commands:
        if cmd[0] == "make":
            assert re.search(rf"^{cmd[1]}:", makefile, flags=re.M), cmd


def test_readme_tool_flags_exist():
    checked = 0
    for cmd in readme_commands():
        script = next((w for w in cmd if re.fullmatch(r"tools/\w+\.py", w)), None)
        if script is None:
            continue
        help_text = tool_help(script)
        for flag in (w.split("=")[0] for w in cmd if w.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", help_text), f"{script} has no {flag} (README: {' '.join(cmd)})"
        checked += 1
    assert checked >= 8


def test_readme_training_lines_resolve_to_valid_configs():
    checked = 0
    for cmd in readme_commands():
        args = pretrain_args(cmd)
        if args is None:
            continue
        configs = [args[i + 1] for i, w in enumerate(args) if w == "--config"]
        sets = [w for w in args if "=" in w and not w.startswith("-")]
        config = configs[-1]
        if not (REPO / config).is_file():  # a user's own file (`--config my.yaml`): the script's recipe stands in
            config = configs[0]
        try:
            load_run_config(str(REPO / config), overrides_from_args([sets]))
        except Exception as e:  # noqa: BLE001 -- report which README line broke
            pytest.fail(f"README line {' '.join(cmd)!r}: {e}")
        checked += 1
    assert checked >= 5


def test_readme_study_table_is_generated_from_the_committed_summary():
    """The README's recipe-study table is `tools/ablate.py --study-table` of the committed summary.json."""
    import json

    from cplm_megatron.experiments.report.study import readme_block

    summary_json = REPO / "benchmarks/results/study_cpu_v3/summary.json"
    block = readme_block(json.loads(summary_json.read_text()))
    assert block in (REPO / "README.md").read_text()
    printed = subprocess.run([sys.executable, str(REPO / "tools/ablate.py"), "--study-table", str(summary_json)],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert printed.returncode == 0 and printed.stdout.strip() == block, printed.stderr[-2000:]
