"""Suite-wide fixtures: data (tests/data_fixtures.py) and the session's trained runs (tests/trained_runs.py);
the environment every test starts from; markers; and the session-end check that no test left a process behind
(tests/session_processes.py)."""
import os
import shutil
import signal
import sys

import pytest

from tests.session_processes import SessionProcesses

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # fused copy kernels run in Triton's CPU interpreter

pytest_plugins = ["tests.data_fixtures", "tests.trained_runs"]

# Every test starts its processes with the signals at their defaults, however the suite was started: under `nohup`
# or in a script's background (`cmd &`), SIGHUP, SIGINT or SIGQUIT arrive ignored, the processes would inherit that,
# and the tests of what those signals do would fail (the tests of a start under nohup ignore them themselves).
signal.signal(signal.SIGHUP, signal.SIG_DFL)
signal.signal(signal.SIGQUIT, signal.SIG_DFL)
signal.signal(signal.SIGINT, signal.default_int_handler)

_PROCESSES = SessionProcesses()  # marks this session's processes before any is started


def pytest_runtest_logstart(nodeid, location):
    _PROCESSES.started(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Fail the session when a process it started is still alive (they are killed and listed)."""
    left = _PROCESSES.check()
    if left:
        print(f"\nerror: {len(left)} process(es) started by this test session are still running (now killed):\n  "
              + "\n  ".join(left), file=sys.stderr, flush=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

# Markers live in the test modules (`pytestmark`): `slow`, `slurm`, and `mcore` where the outcome depends on
# megatron-core. `make test-mcore-latest` runs `-m mcore_latest` on the newest megatron-core: every fast `mcore`
# test (derived here), plus the slow ones that carry `mcore_latest` themselves (layout equality, the compat
# scenarios, end-to-end training in fp32 and bf16, resume, HF export, the GPU dry run).


# `make test` runs the suite on pytest-xdist workers (--dist loadgroup): tests are handed out one by one, except
# that the SLURM tests share one group (one local cluster per machine: fixed ports, /etc/slurm) and a file whose
# tests use a module-scoped fixture is one group (its fixture, often a trained model or a built environment, is
# built once, on one worker).
SHARED_GROUPS = {"slurm": "slurm"}  # tests/<directory> -> group


def xdist_group_of(item) -> str | None:
    """The xdist group of a test: its directory's shared group, its file when it uses a module-scoped fixture,
    else none."""
    path = item.path.relative_to(item.config.rootpath)
    if len(path.parts) > 2 and path.parts[1] in SHARED_GROUPS:
        return SHARED_GROUPS[path.parts[1]]
    defs = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for ds in (defs.name2fixturedefs.values() if defs else ()) for d in ds}
    return str(path) if "module" in scopes else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mcore") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.mcore_latest)
        group = xdist_group_of(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
            if getattr(config.option, "loadgroup", False) and "@" not in item.nodeid:
                name_group(item, group)


def name_group(item, group: str) -> None:
    """Append `@group` to a test's id, as xdist's worker does for a marked test: its scheduler groups by that suffix.
    xdist 3.8 sets `item._nodeid`, which pytest >= 9.2 no longer reads (the id is `item._id`, structured), so its
    groups never form there; this sets whichever the running pytest reads."""
    new = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(new)
    else:
        item._nodeid = new


@pytest.fixture(autouse=True)
def _megatron_patches_for_megatron_tests(request):
    """pytest is the entry point of the in-process megatron tests (single_process_megatron in this process):
    it applies the megatron-core patch layer as the other entry points do (megatron_patches.setup_compat, here quietly)."""
    if request.node.get_closest_marker("mcore"):
        from cplm_megatron.parallel.megatron_patches import apply_compat

        apply_compat()
