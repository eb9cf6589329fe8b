"""The README's and docs/'s commands stay runnable: every tool flag they show exists, every recipe + `--set` line
(direct, through torchrun or an sbatch script) resolves to a valid config for the world size it launches, every
make target exists and the install lines pick what they say, the README stays short, its figures are the committed
results', and its Python example loads an export's model and tokenizer with no terminal and generates. (The long
commands themselves run elsewhere: `make demo`/`make test` in CI, training/SLURM/conversion in their own tests.)"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from cplm_megatron.run_config import load_run_config, overrides_from_args

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_VALUES = {"$copy": "true"}  # loop variables in the examples
GPUS_PER_NODE = 8  # what the sbatch scripts ask for per node


def commands(page: Path) -> list[list[str]]:
    """Each command line of a page's bash blocks (continuations joined, comments and [optional] parts dropped)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line.split(" #")[0]).strip()
            for var, value in SHELL_VALUES.items():
                line = line.replace(var, value)
            if line and not line.startswith(("for ", "done", "#")):
                out.append(shlex.split(line))
    return out


def all_commands() -> list[tuple[str, list[str]]]:
    return [(page.name, cmd) for page in PAGES for cmd in commands(page)]


def readme_commands() -> list[list[str]]:
    return commands(REPO / "README.md")


@lru_cache(maxsize=None)
def tool_help(script: str) -> str:
    """`--help` of a script (`tools/NAME.py`) or of a benchmark module (`benchmarks.NAME`, run with -m)."""
    target = [str(REPO / script)] if script.endswith(".py") else ["-m", script]
    proc = subprocess.run([sys.executable, *target, "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def pretrain_args(cmd: list[str]) -> tuple[list[str], int] | None:
    """(the pretrain_cplm.py arguments, recipe first; the number of processes it launches) of a direct, torchrun or
    sbatch training command; None otherwise."""
    for i, word in enumerate(cmd):
        if word.endswith("pretrain/pretrain_cplm.py"):
            nproc = next((int(cmd[j + 1]) for j in range(i) if cmd[j] == "--nproc_per_node"), 1)
            return cmd[i + 1:], nproc
        if word.startswith("slurm/pretrain_") and word.endswith(".sh"):
            script = (REPO / word).read_text()
            recipe = re.search(r"^recipe=(\S+)", script, flags=re.M).group(1)
            nodes = int(re.search(r"^#SBATCH --nodes=(\d+)", script, flags=re.M).group(1))
            for j, w in enumerate(cmd[:i]):  # sbatch's own --nodes N / --nodes=N
                if w.startswith("--nodes"):
                    nodes = int(w.split("=")[1] if "=" in w else cmd[j + 1])
            return ["--config", recipe, *cmd[i + 1:]], nodes * GPUS_PER_NODE
    return None


def test_readme_is_short_and_has_the_two_commands_and_they_are_make_targets():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
    commands_ = readme_commands()
    assert ["make", "demo"] in commands_ and ["make", "test"] in commands_
    makefile = (REPO / "Makefile").read_text()
    for page, cmd in all_commands():
        if cmd[0] == "make":
            assert re.search(rf"^{cmd[1]}:", makefile, flags=re.M), (page, cmd)


def test_docs_pages_exist_where_the_readme_links_them():
    readme = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\(((?:docs|benchmarks|slurm|cplm_kernels)/[^)#]+)", readme):
        assert (REPO / link).exists(), link
    for page in PAGES[1:]:
        for link in re.findall(r"\]\(([\w-]+\.md)", page.read_text()):
            assert (REPO / "docs" / link).exists(), (page.name, link)


def test_readme_install_lines_pick_what_they_say(tmp_path: Path):
    """`make setup` on a GPU machine installs Transformer Engine (the gpu extra); `make setup EXTRAS=dev` does not,
    and still takes the GPU pins (CUDA torch, not the CPU build)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    setups = [cmd for cmd in readme_commands() if cmd[:2] == ["make", "setup"]]
    assert ["make", "setup"] in setups and ["make", "setup", "EXTRAS=dev"] in setups
    for cmd in setups:
        out = subprocess.run([*cmd[:1], "-n", *cmd[1:], f"VENV={tmp_path}/venv"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        install = next(line for line in out.stdout.splitlines() if '-e ".[' in line)
        assert "constraints-gpu.txt" in install and "torch==2.13.0" not in out.stdout
        assert ('".[dev,gpu]"' in install) == (cmd == ["make", "setup"]), (cmd, install)


def test_tool_flags_exist():
    checked = 0
    for page, cmd in all_commands():
        script = next((w for w in cmd if re.fullmatch(r"tools/\w+\.py", w)), None) or next(
            (m for flag, m in zip(cmd, cmd[1:]) if flag == "-m" and re.fullmatch(r"benchmarks(\.\w+)+", m)), None)
        if script is None and any(w.endswith("pretrain/pretrain_cplm.py") for w in cmd):
            script = "pretrain/pretrain_cplm.py"
            cmd = cmd[cmd.index(next(w for w in cmd if w.endswith("pretrain/pretrain_cplm.py"))):]
        if script is None:
            continue
        help_text = tool_help(script)
        for flag in (w.split("=")[0] for w in cmd if w.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", help_text), f"{script} has no {flag} ({page}: {' '.join(cmd)})"
        checked += 1
    assert checked >= 30


def test_benchmarks_are_run_as_modules():
    """The benchmarks are a package (their helpers imported as `benchmarks.common`, no sys.path edits): every page,
    usage line and the GPU check's scripts run one as `python -m benchmarks.NAME` from the checkout's root, never
    by its path (which would fail to import its helpers)."""
    by_path = re.compile(r"(?:python3?|\"\$PY\")\s+(?:\S*/)?benchmarks/[\w/]+\.py")
    files = [*PAGES, REPO / "cplm_kernels" / "README.md", REPO / "slurm" / "README.md", REPO / "Makefile",
             *sorted((REPO / "benchmarks").rglob("*.py")), *sorted((REPO / "benchmarks").rglob("*.sh"))]
    found = [f"{path.relative_to(REPO)}: {m.group(0)}" for path in files for m in by_path.finditer(path.read_text())]
    assert found == []
    modules = [w for _, cmd in all_commands() for w in cmd if w.startswith("benchmarks.")]
    assert "benchmarks.long_context" in modules, modules


def test_training_lines_resolve_to_valid_configs_for_their_world_size():
    checked = 0
    for page, cmd in all_commands():
        found = pretrain_args(cmd)
        if found is None:
            continue
        args, world = found
        configs = [args[i + 1] for i, w in enumerate(args) if w == "--config"]
        sets = [w for w in args if "=" in w and not w.startswith("-")]
        config = configs[-1]
        if not (REPO / config).is_file():  # a user's own file (`--config my.yaml`): the script's recipe stands in
            config = configs[0]
        try:
            load_run_config(str(REPO / config), overrides_from_args([sets])).validate_world(world)
        except Exception as e:  # noqa: BLE001 -- report which line broke
            pytest.fail(f"{page}: {' '.join(cmd)!r} on {world} processes: {e}")
        checked += 1
    assert checked >= 12


def test_the_study_table_is_generated_from_the_committed_summary_and_the_readme_quotes_it():
    """docs/evaluation.md's table is `tools/ablate.py --study-table` of the committed summary.json; the README's
    short table quotes its baseline, control and default-arm rows."""
    import json

    from cplm_megatron.experiments.study.report import readme_block

    summary_json = REPO / "results/study_cpu_v3/summary.json"
    block = readme_block(json.loads(summary_json.read_text()))
    assert block in (REPO / "docs/evaluation.md").read_text()
    printed = subprocess.run([sys.executable, str(REPO / "tools/ablate.py"), "--study-table", str(summary_json)],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert printed.returncode == 0 and printed.stdout.strip() == block, printed.stderr[-2000:]
    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split(" | ")]

    rows = {(r[0].split(" (")[0], r[1]): r for r in map(cells, block.splitlines()[3:-1])}
    readme = (REPO / "README.md").read_text()
    quoted = [cells(line) for line in readme.splitlines() if line.startswith(("| tiny (", "| small ("))]
    assert len(quoted) == 2
    for row in quoted:
        scale = row[0].split(" (")[0]
        base, cache, aux1 = rows[(scale, "baseline")], rows[(scale, "baseline+cache (control)")], \
            rows[(scale, "aux1 **(default)**")]
        assert row[1:6] == [base[2], cache[2], aux1[2], aux1[3], aux1[4]], (row, aux1)


def test_the_readme_gpu_figures_are_the_committed_ones():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Measured on one H200", 1)[1].split("\n### ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| "))
    committed = (REPO / "results/gpu/2026-12-04/README.md").read_text()
    figures = [f.removesuffix(" GiB") for f in re.findall(r"\d+(?:\.\d+)?(?:k|%| GiB)", table)]
    assert len(figures) >= 12
    for figure in figures:
        assert figure in committed, figure


@pytest.mark.slow
def test_the_readme_python_example_loads_model_and_tokenizer_without_a_prompt(hf_exports):
    """The README's example, pointed at an exported CPLM, in a fresh interpreter with no stdin: the model and the
    tokenizer load without transformers' remote-code question and it generates."""
    readme = (REPO / "README.md").read_text()
    [example] = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    path = re.search(r'from_pretrained\("([^"]+)"', example).group(1)
    code = example.replace(f'"{path}"', repr(str(hf_exports["cplm"]))).replace("max_new_tokens=32", "max_new_tokens=4")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[y/N]" not in proc.stdout + proc.stderr and "custom code" not in proc.stdout + proc.stderr
    assert proc.stdout.strip()
