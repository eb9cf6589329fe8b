"""The local SLURM cluster of a test session: slurm/local_cluster/start.sh once, reconfigured between
node counts (one restart per change), stopped at the end (CPLM_SLURM_KEEP=1 leaves it running).

The cluster is real: munged, slurmctld and one slurmd per emulated node on this machine, 8 fake GPUs
per node (so the scripts' --gpus-per-node=8 stays as written) and 32 advertised CPUs per node. It
needs root and apt (the start script installs slurm + munge when missing); without them these tests
fail with the reason instead of skipping.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.jobs import SLURM_DIR

CLUSTER_SCRIPTS = SLURM_DIR / "local_cluster"
CLUSTER_ROOT = Path(os.environ.get("CPLM_SLURM_CI_ROOT", "/tmp/cplm-local-slurm"))
FAKE_GPUS_PER_NODE = 8
CPUS_PER_NODE = 32  # >= 2 tasks x the scripts' --cpus-per-task=12
START_TIMEOUT = 300  # includes apt-get install on a fresh machine


class LocalSlurm:
    """Starts, reconfigures and stops the session's cluster."""

    def __init__(self, root: Path):
        self.root = root
        self.nodes: int | None = None
        self._fresh = True

    def _env(self, nodes: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SLURM_CI_ROOT=str(self.root), SLURM_CI_NODES=str(nodes), SLURM_CI_GPUS=str(FAKE_GPUS_PER_NODE),
                   SLURM_CI_CPUS=str(CPUS_PER_NODE), SLURM_CI_FRESH="1" if self._fresh else "0",
                   # finished jobs leave scontrol after 4 s, which makes `sbatch --wait` poll every 2 s
                   SLURM_CI_MIN_JOB_AGE="4")
        return env

    def ensure(self, nodes: int) -> None:
        """Make the cluster `nodes` emulated nodes (1 = this host's name; more = c1..cN), all idle."""
        if self.nodes == nodes:
            return
        if os.geteuid() != 0:
            pytest.fail("the SLURM tests need root: the local cluster writes /etc/slurm and /etc/hosts, installs "
                        "packages and starts daemons (run as root, or deselect them with -m 'not slurm')")
        if self.nodes is not None:
            self.stop()
        result = subprocess.run([str(CLUSTER_SCRIPTS / "start.sh")], env=self._env(nodes), capture_output=True,
                                text=True, timeout=START_TIMEOUT, check=False)
        if result.returncode != 0:
            pytest.fail(f"could not start the local SLURM cluster ({nodes} node(s)); start.sh exited "
                        f"{result.returncode}. It needs apt access to install slurmd slurmctld slurm-client munge "
                        f"(Debian 12) and root. Output:\n{result.stdout}\n{result.stderr}")
        self._fresh = False
        self.nodes = nodes

    def stop(self) -> None:
        """Cancel every job and stop the daemons."""
        subprocess.run([str(CLUSTER_SCRIPTS / "stop.sh")], env=self._env(self.nodes or 1), capture_output=True,
                       timeout=120, check=False)
        self.nodes = None


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    cluster = LocalSlurm(CLUSTER_ROOT)
    yield cluster
    if cluster.nodes is not None and os.environ.get("CPLM_SLURM_KEEP") != "1":
        cluster.stop()
