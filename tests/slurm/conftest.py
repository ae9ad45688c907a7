"""The local development Slurm cluster (``slurm/devcluster up``) as a session fixture.

Tests that use ``slurm_cluster`` are marked ``integration`` and ``slurm``. When the cluster
cannot be brought up (no root, not Debian/Ubuntu, ...) they are skipped with the reason, so a
user sees what did not run; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import ROOT, env_for_tests, require_setup

DEVCLUSTER = ROOT / "slurm" / "devcluster"
UP_TIMEOUT_S = 900  # first run installs packages with apt-get


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """What tests may rely on: the script, the default partition and its two nodes."""

    script: Path = DEVCLUSTER
    partition: str = "debug"
    nodes: tuple[str, ...] = ("n1", "n2")
    cpus_per_node: int = 2
    up_output: str = ""


def devcluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``slurm/devcluster ARGS`` with the test environment (no inherited SLURM_* etc.)."""
    return subprocess.run(
        ["bash", str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, env=env_for_tests(), check=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Bring the dev cluster up once per session (fast when it already runs) and yield it."""
    output = require_setup(["bash", str(DEVCLUSTER), "up"], timeout=UP_TIMEOUT_S,
                           what="slurm/devcluster up", env=env_for_tests())
    yield SlurmCluster(up_output=output)
