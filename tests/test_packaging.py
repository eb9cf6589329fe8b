"""The wheel installs and works outside the checkout: built from setup.py, installed into a directory of its
own, it holds every subpackage, the recipes and presets and the HF export's files, and trains the tiny recipe
(`python -m cplm_megatron.pretrain --config tiny`) and evaluates the run (`python -m cplm_megatron.evaluate`)
from another directory, with the checkout's editable install out of the way (`python -S`: no .pth files)."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests import harness
from tests.training.pretrain_utils import tiny_overrides

REPO = harness.REPO
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("isolated_streaming")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the directory it was installed into)."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # the checkout's files (tracked and new, not ignored): the build leaves the tree clean
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    build = subprocess.run([*pip, "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(out)], cwd=source,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = out.glob("cplm_megatron-*.whl")
    target = out / "site"
    install = subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return wheel, target


def test_the_wheel_holds_every_subpackage_and_the_data_files(installed):
    wheel, target = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in REPO.joinpath("cplm_megatron").rglob("__init__.py"):
        assert str(package.relative_to(REPO)) in names
    assert {"cplm_megatron/evaluation/tasks/val.py", "cplm_megatron/recipes/tiny.yaml",
            "cplm_megatron/recipes/models/smollm2-1.7b.yaml", "cplm_megatron/hf/modeling_cplm.py",
            "cplm_kernels/linear_ce.py"} <= names, sorted(names)[:20]
    assert any(n.startswith("cplm_megatron/evaluation/tasks/lm_eval_tasks/") and n.endswith(".yaml") for n in names)
    assert not any(n.startswith(("benchmarks/", "tests/", "tools/")) for n in names)  # run from the checkout only
    recipes = {p.name for p in REPO.joinpath("configs").glob("*.yaml")}
    assert recipes == {n.split("/")[-1] for n in names if n.startswith("cplm_megatron/recipes/") and n.count("/") == 2
                       and n.endswith(".yaml")}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "cplm-pretrain = cplm_megatron.pretrain:script_main" in text and "cplm-evaluate" in text


def test_trains_and_evaluates_from_another_directory(installed, stdlib_corpus, tmp_path):
    _, target = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the venv's packages without their .pth files (the checkout's editable install is one), the wheel first
    env = harness.process_env({"PYTHONPATH": os.pathsep.join([str(target), *site.getsitepackages()])})
    where = subprocess.run([sys.executable, "-S", "-c", "import cplm_megatron, cplm_kernels; "
                            "print(cplm_megatron.__file__, cplm_kernels.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(path.startswith(str(target)) for path in where.stdout.split()), where.stdout
    run_dir = elsewhere / "run"
    train = subprocess.run([sys.executable, "-S", "-m", "cplm_megatron.pretrain", "--config", "tiny", "--set",
                            *tiny_overrides(stdlib_corpus, run_dir, iters=3)],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (run_dir / "checkpoints" / "iter_0000003").is_dir()
    out = elsewhere / "eval.json"
    evaluate = subprocess.run([sys.executable, "-S", "-m", "cplm_megatron.evaluate", "--checkpoint", str(run_dir),
                               "--tasks", "val,copy", "--limit", "4", "--no-progress", "--output", str(out)],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert evaluate.returncode == 0, evaluate.stdout[-3000:] + evaluate.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["iteration"] == 3 and results["tasks"]["val"]["metrics"]["val_loss"] > 0
    assert 0 <= results["tasks"]["copy"]["metrics"]["copy_accuracy"] <= 1


STUDY = """
import sys
from pathlib import Path

from cplm_megatron.experiments.ablation.plan import AblationSettings
from cplm_megatron.experiments.pipeline import run_ablation

if __name__ == "__main__":
    settings = AblationSettings(experiments=("spamlang",), spamlang_vocabs=(4096,), spamlang_ties=(False,),
                                spamlang_iters=4, spamlang_interval=2, eval_sequences=2)
    outcome = run_ablation(Path(sys.argv[1]), settings, jobs=1, backend=sys.argv[2],
                           on_done=lambda r: print(r.status_line(), flush=True))
    print("report", outcome.report)
"""


def test_runs_a_two_run_study_from_another_directory_and_reuses_it(installed, tmp_path):
    """The launcher runs `python -m cplm_megatron.pretrain` / `.evaluate` (nothing in a checkout): an ablation pair
    trains, evaluates and reports from the installed wheel; run again, both runs are reused."""
    _, target = installed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "study.py").write_text(STUDY)
    env = harness.process_env({"PYTHONPATH": os.pathsep.join([str(target), *site.getsitepackages()])})
    out = elsewhere / "study"

    def study(backend: str) -> str:
        done = subprocess.run([sys.executable, "-S", "study.py", str(out), backend], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    first = study("warm")
    assert first.count(": done (train ") == 2, first
    command = (out / "runs" / "spamlang-v4096-untied-cplm" / "train.log").read_text().splitlines()[0].split()
    assert command[:2] == ["$", sys.executable] and "-S" in command  # this interpreter, with its flags
    assert command[command.index("-m"):][:5] == ["-m", "cplm_megatron.pretrain", "--config", "tiny", "--set"]
    assert (out / "report.md").is_file() and (out / "loss_curves.png").is_file()
    evaluated = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/eval.json")}
    assert len(evaluated) == 2
    again = study("subprocess")
    assert again.count(": reused (finished earlier with the same commands)") == 2, again
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/eval.json")} == evaluated


def test_no_package_of_the_checkout_shadows_an_installed_module():
    """Run from the checkout (pytest, tools/), a top-level package directory hides the installed module of its name
    from every library: transformers 5.25 imports Hugging Face's `kernels`, and our kernels/ broke tests/hf."""
    ours = sorted(p.parent.name for p in REPO.glob("*/__init__.py"))
    installed_by = packages_distributions()
    clashes = {name: installed_by[name] for name in ours if set(installed_by.get(name, [])) - {"cplm-megatron"}}
    assert clashes == {}, f"rename these checkout packages: {clashes}"


def install_commands() -> list[list[str]]:
    """The commands of docs/training.md's "Installing without make"."""
    text = (REPO / "docs" / "training.md").read_text().split("## Installing without make", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def image_site() -> Path:
    """The site-packages of the GPU image's emulation (`make gpu-image-env`, cached): torch, transformers, numpy and
    the rest of what an NGC-like image has, nothing of the project."""
    make = subprocess.run(["make", "--no-print-directory", "gpu-image-env"], cwd=REPO, capture_output=True, text=True,
                          timeout=1200)
    assert make.returncode == 0, make.stdout[-3000:] + make.stderr[-3000:]
    [site_dir] = (REPO / ".venv-gpu-image" / "lib").glob("python3.*/site-packages")
    return site_dir


def test_pip_alone_installs_the_wheel_into_an_environment_that_has_torch(installed, image_site, stdlib_corpus,
                                                                        tmp_path):
    """docs/training.md's commands, as written but for the wheel in place of `.` and the CPU constraints in place of
    the GPU ones, in a fresh venv outside the checkout whose base is an image's packages (seen through a .pth file,
    read-only): pip prints no ERROR, the install check passes, the core's dependencies suffice to train the tiny
    recipe from another directory, and the modules come from the venv."""
    wheel, _ = installed
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    [site_dir] = (venv / "lib").glob("python3.*/site-packages")
    (site_dir / "image.pth").write_text(f"{image_site}\n")
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in harness.process_env().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for cmd in install_commands():
        settings = dict(word.split("=", 1) for word in cmd if re.fullmatch(r"[A-Z_]+=.*", word))
        cmd = [word for word in cmd if not re.fullmatch(r"[A-Z_]+=.*", word)]
        cmd = [str(wheel) if word == "." else str(REPO / word.replace("-gpu.txt", "-cpu.txt"))
               if word.startswith("requirements/") else word for word in cmd]
        if cmd[0] == "pip":
            cmd = [python, "-m", "pip", *cmd[1:2], "-q", "--no-compile", *cmd[2:]]
        else:
            cmd = [python, *cmd[1:]]
        proc = subprocess.run(cmd, cwd=tmp_path, env={**env, **settings}, capture_output=True, text=True, timeout=1200)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and not re.search(r"^ERROR", out, flags=re.M), (cmd, out[-3000:])
    assert out.startswith("[setup] pip check: no broken requirements but mosaicml-streaming"), out
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([python, "-c", "import cplm_megatron.data.loader, megatron.core, streaming; "
                            "print(cplm_megatron.__file__, megatron.core.__file__, streaming.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0 and all(p.startswith(str(site_dir)) for p in where.stdout.split()), where
    run_dir = elsewhere / "run"
    train = subprocess.run([python, "-m", "cplm_megatron.pretrain", "--config", "tiny", "--set",
                            *tiny_overrides(stdlib_corpus, run_dir, iters=2)],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (run_dir / "checkpoints" / "iter_0000002").is_dir()
