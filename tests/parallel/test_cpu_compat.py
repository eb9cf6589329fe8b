"""The CPU-compat layer: every patch is needed (its scenario fails without it, in a fresh process),
all scenarios pass with the layer, and nothing CPU-only is applied when CUDA is present."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cplm_megatron.parallel.cpu_compat import PATCHES

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

# patch -> (scenario that needs it, what goes wrong without it)
NEEDED_BY = {
    "rng_tracker": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "current_device": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "cuda_placement": ("train_step_single", "Torch not compiled with CUDA enabled"),
    "synchronize": ("pipeline_parallel", "Torch not compiled with CUDA enabled"),
    "missing_state_keys": ("distopt_resume", "KeyError: 'step'"),
    "shared_step": ("distopt_resume", "share one Adam `step` tensor"),
    "sp_norm": ("sequence_parallel", "sequence parallel not supported by torch LayerNorm"),
    "grad_norm_precision": ("grad_norm_precision", "AssertionError"),
}


def scenario(name: str, skip: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, CPLM_COMPAT_SKIP=skip, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "tests.parallel.compat_scenarios", name], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def test_every_patch_has_a_scenario():
    assert set(NEEDED_BY) == {p.name for p in PATCHES}


@pytest.mark.parametrize("name", sorted({s for s, _ in NEEDED_BY.values()}))
def test_scenarios_pass_with_the_layer(name):
    proc = scenario(name)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("patch", sorted(NEEDED_BY))
def test_each_patch_is_needed(patch):
    name, symptom = NEEDED_BY[patch]
    proc = scenario(name, skip=patch)
    assert proc.returncode != 0, f"{name} passed without the {patch} patch"
    assert symptom in proc.stdout + proc.stderr, proc.stderr[-4000:]


SCOPE_PROBE = """
import torch
torch.cuda.is_available = lambda: True   # what a GPU machine reports (selection logic only)
from cplm_megatron.parallel import cpu_compat
applied = cpu_compat.apply_compat()
print(",".join(applied))
assert cpu_compat.apply_compat() == applied
"""


def test_gpu_machines_get_no_cpu_patches():
    proc = subprocess.run([sys.executable, "-c", SCOPE_PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    applied = set(proc.stdout.strip().splitlines()[-1].split(","))
    cpu_only = {p.name for p in PATCHES if p.scope == "cpu"}
    assert not applied & cpu_only
    assert applied == {p.name for p in PATCHES if p.scope == "no_apex_te"}  # no Apex/TE installed here


def test_apply_is_idempotent_and_rejects_unknown_names():
    probe = ("from cplm_megatron.parallel import cpu_compat as c\n"
             "from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D\n"
             "a = c.apply_compat(); f = D.load_state_dict; b = c.apply_compat()\n"
             "assert a == b and D.load_state_dict is f, 'patched twice'\n"
             "try:\n    c.apply_compat(skip=['nope'])\nexcept ValueError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unknown compat patch(es) ['nope']" in proc.stdout
