"""The local development Slurm cluster (``slurm/devcluster up``) as a session fixture.

Tests that use ``slurm_cluster`` are marked ``integration`` and ``slurm``. When the cluster
cannot be brought up (no root, not Debian/Ubuntu, ...) they are skipped with the reason, so a
user sees what did not run; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken cluster.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import ROOT, env_for_tests

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


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Bring the dev cluster up once per session (fast when it already runs) and yield it."""
    try:
        proc = devcluster("up", timeout=UP_TIMEOUT_S)
        code: int | None = proc.returncode
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = "".join(
            s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
            for s in (exc.stdout, exc.stderr))
        output += f"\n(timed out after {UP_TIMEOUT_S} s)"
    if code != 0:
        why = "cannot run here" if code == 2 else f"exit code {code}"
        reason = f"slurm/devcluster up failed ({why}):\n{_tail(output)}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    yield SlurmCluster(up_output=output)
