"""`make setup`'s pins: GPU machines install through the GPU constraints, CPU machines through the CPU ones;
both pin megatron-core to a tested release that setup.py's range admits; the latest leg pins the newest one. Its
end is clean: mosaicml-streaming comes last without its dependencies, and `pip check` finds nothing else broken.

A fresh `make setup` (about 2 minutes of a core) is not rebuilt here: CI's set-up leg is one, on a fresh clone,
and .ci/run fails when its log has an `ERROR` line (test_ci_fails_a_set_up_that_prints_an_error)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from cplm_megatron import install_check

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements"


def make_dry_run(target: str, tmp_path: Path, nvidia_smi_exit: int) -> str:
    """`make -n TARGET` for a fresh venv, with an nvidia-smi on PATH that lists a GPU (exit 0) or fails."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\nexit {nvidia_smi_exit}\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    proc = subprocess.run(["make", "-n", target, f"VENV={tmp_path}/venv", f"LATEST_VENV={tmp_path}/venv-latest"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def pins(name: str) -> dict[str, list[Requirement]]:
    """The requirement lines of requirements/NAME, by project name."""
    out: dict[str, list[Requirement]] = {}
    for line in (REQUIREMENTS / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            out.setdefault(req.name, []).append(req)
    return out


def megatron_pins() -> dict[str, str]:
    """python_version marker -> pinned megatron-core release."""
    return {str(r.marker): str(r.specifier).removeprefix("==") for r in pins("constraints-megatron-core.txt")["megatron-core"]}


def test_gpu_machines_install_through_the_gpu_constraints(tmp_path: Path):
    out = make_dry_run("setup", tmp_path, nvidia_smi_exit=0)
    install = [line for line in out.splitlines() if "-e \".[" in line]
    assert install and "-c requirements/constraints-gpu.txt -c requirements/constraints-megatron-core.txt" in install[0]
    assert '-e ".[dev,gpu]"' in install[0]
    assert "constraints-cpu.txt" not in out and "torch==2.13.0" not in out  # the node's CUDA torch, not the CPU pin


def test_cpu_machines_install_through_the_cpu_constraints(tmp_path: Path):
    out = make_dry_run("setup", tmp_path, nvidia_smi_exit=1)
    assert "-c requirements/constraints-cpu.txt -c requirements/constraints-megatron-core.txt" in out
    assert '"torch==2.13.0"' in out and '-e ".[dev]"' in out and "constraints-gpu.txt" not in out


def test_tested_megatron_releases_fit_setup_py_and_the_latest_leg_pins_the_newest(tmp_path: Path):
    versions = megatron_pins()
    assert versions == {'python_version < "3.12"': "0.16.1", 'python_version >= "3.12"': "0.19.2"}
    setup_py = (REPO / "setup.py").read_text()
    bound = Requirement(re.search(r'"(megatron-core[^"]*)"', setup_py).group(1))
    assert all(Version(v) in bound.specifier for v in versions.values()), bound
    newest = max(versions.values(), key=Version)
    out = make_dry_run("setup-mcore-latest", tmp_path, nvidia_smi_exit=1)
    assert f'--no-deps --ignore-requires-python "megatron-core=={newest}"' in out
    assert "constraints-megatron-core.txt" not in out  # its Python 3.11 line would pull the version back


def test_gpu_constraints_admit_the_versions_tested_on_gpu_and_cpu():
    gpu = pins("constraints-gpu.txt")
    for name, tested in (("torch", ("2.11.0", "2.13.0")), ("triton", ("3.6.0", "3.9.0"))):
        [req] = gpu[name]
        assert all(Version(v) in req.specifier for v in tested), (name, req)
    assert {"transformer-engine", "transformer-engine-torch"} <= set(gpu)


def test_streaming_is_installed_last_without_its_dependencies_and_the_end_is_checked(tmp_path: Path):
    """pip's resolver reports the declared requirements of every installed package that an install touches: with
    mosaicml-streaming already there, the project's install ended in an `ERROR:` block (cloud SDKs, torchvision,
    transformers<5); installed after it, with --no-deps, nothing reports them, and install_check runs last."""
    for target in ("setup", "setup-mcore-latest"):
        lines = make_dry_run(target, tmp_path, nvidia_smi_exit=1).splitlines()
        project = next(i for i, line in enumerate(lines) if '-e ".[' in line)
        streaming = next(i for i, line in enumerate(lines) if " install " in line and "mosaicml-streaming==0.13.0" in line)
        check = next(i for i, line in enumerate(lines) if line.endswith("-m cplm_megatron.install_check"))
        assert project < streaming < check and "--no-deps" in lines[streaming], lines


def test_install_check_accepts_this_environment_and_only_streamings_declared_extras():
    proc = subprocess.run([sys.executable, "-m", "cplm_megatron.install_check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    assert proc.stdout.startswith("[setup] pip check: no broken requirements but mosaicml-streaming") and \
        proc.stdout.count("\n") == 1
    report = ("mosaicml-streaming 0.13.0 requires azure-identity, which is not installed.\n"
              "mosaicml-streaming 0.13.0 has requirement transformers<5,>=4.21.3, but you have transformers 5.25.0.\n")
    assert install_check.unexpected(report) == []
    others = ("mosaicml-streaming 0.13.0 has requirement numpy<2.2.0,>=1.21.5, but you have numpy 2.3.0.\n"
              "megatron-core 0.16.1 requires einops, which is not installed.\n")
    assert install_check.unexpected(report + others) == others.splitlines()


def test_ci_fails_a_set_up_that_prints_an_error(tmp_path: Path):
    """.ci/run's set-up check on a log: an `ERROR` line fails it, pip's location warnings do not."""
    script = (REPO / ".ci" / "run").read_text()
    check = next(line for line in script.splitlines() if line.startswith("setup_failed()"))
    for log, failed in (("WARNING: Location 'x' is ignored\n[setup] environment ready in .venv\n", False),
                        ("ERROR: pip's dependency resolver does not currently take into account ...\n", True)):
        (tmp_path / "setup.log").write_text(log)
        proc = subprocess.run(["bash", "-c", f"{check}\nsetup_failed {tmp_path / 'setup.log'}"], capture_output=True,
                              text=True, timeout=30)
        assert (proc.returncode == 0) == failed, proc.stdout + proc.stderr
