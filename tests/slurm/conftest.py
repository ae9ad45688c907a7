"""The local development Slurm cluster (``slurm/devcluster up``) as a session fixture.

Tests that use ``slurm_cluster`` are marked ``integration`` and ``slurm``. When the cluster
cannot be brought up (no root, not Debian/Ubuntu, ...) they are skipped with the reason, so a
user sees what did not run; in CI (``CI=true``) that is a failure instead, since a skip there
would hide a broken cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import ROOT, beside, env_for_tests, require_setup, torchjob

DEVCLUSTER = ROOT / "slurm" / "devcluster"
UP_TIMEOUT_S = 900  # first run installs packages with apt-get
REQUEUE_SETTLE_S = 5.0  # see requeued_at_once


@dataclass(frozen=True, kw_only=True)
class SlurmCluster:
    """What tests may rely on: the script, the default partition and its two nodes."""

    script: Path = DEVCLUSTER
    partition: str = "debug"
    nodes: tuple[str, ...] = ("n1", "n2")


def devcluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``slurm/devcluster ARGS`` with the test environment (no inherited SLURM_* etc.)."""
    return subprocess.run(
        ["bash", str(DEVCLUSTER), *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL, env=env_for_tests(), check=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Bring the dev cluster up once per session (fast when it already runs) and yield it."""
    require_setup(["bash", str(DEVCLUSTER), "up"], timeout=UP_TIMEOUT_S,
                  what="slurm/devcluster up", env=env_for_tests())
    yield SlurmCluster()


@contextlib.contextmanager
def requeued_at_once(job_id: str) -> Iterator[None]:
    """While inside: a requeued ``job_id`` starts again at once. Slurm holds a requeued job for
    ~2 minutes (reason BeginTime); ``scontrol update StartTime=now`` lifts that, a few seconds
    after the requeue: started at once, the nodes may still hold the revoked credential of the
    attempt that just ended, and Slurm kills the new one ("Job credential revoked")."""
    def lift(stop: threading.Event) -> None:
        held_since = None
        while not stop.wait(0.5):
            out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], text=True,
                                 capture_output=True, env=env_for_tests(), check=False).stdout
            if out.split() != ["PENDING", "BeginTime"]:
                held_since = None
            elif held_since is None:
                held_since = time.monotonic()
            elif time.monotonic() - held_since > REQUEUE_SETTLE_S:
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                               capture_output=True, env=env_for_tests(), check=False)

    with beside(lift):
        yield


def step_processes(job_id: str, node: str) -> list[int]:
    """The processes of ``job_id``'s job step on ``node`` (wrapper, agent, workers), told by the
    environment Slurm gave them; the batch shell (no SLURM_STEP_ID) is not one of them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
        except OSError:
            continue
        env = dict(v.split(b"=", 1) for v in raw.split(b"\0") if b"=" in v)
        if (env.get(b"SLURM_JOB_ID") == job_id.encode() and env.get(b"SLURMD_NODENAME")
                == node.encode() and env.get(b"SLURM_STEP_ID", b"batch").isdigit()):
            found.append(int(entry.name))
    return found


# The default job's trainer arguments at world size 4 (2 nodes x 2 processes): batch 16 per rank
# is torchjob run's global batch of 64 (2 processes x 32). Same seed everywhere (the default).
TWO_BY_TWO_SETS = ("nnodes=2", "nproc_per_node=2", "trainer.args.batch_size=16",
                   "trainer.args.epochs=12")


@pytest.fixture(scope="session")
def local_two_by_two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """``torchjob run`` of the default job on 2 emulated nodes x 2 processes, here: its
    summary.json, the reference each Slurm path must match exactly."""
    run_dir = tmp_path_factory.mktemp("local-2x2")
    sets = [*TWO_BY_TWO_SETS, "local.nodes=2", f"run_dir={run_dir}"]
    proc = torchjob("run", str(ROOT / "jobs/examples/default.yaml"),
                    *[w for s in sets for w in ("--set", s)], env=env_for_tests(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, float] = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4
    return summary


def assert_same_result(ours: dict[str, float], local: dict[str, float]) -> None:
    """Equal world size, seed and global batch: the same data order and the same sums, so the
    same model: accuracy and loss equal to the last bit."""
    keys = ("world_size", "steps", "accuracy", "final_loss")
    assert {k: ours[k] for k in keys} == {k: local[k] for k in keys}, (ours, local)


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The ``shellcheck`` command, installed with apt-get (as root) when missing. A test that
    needs it fails, never skips, when it cannot be had: the shell that reaches sbatch must be
    checked."""
    found = shutil.which("shellcheck")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail("shellcheck is missing and cannot be installed here (needs root and "
                    "apt-get): apt-get install shellcheck", pytrace=False)
    apt = ["apt-get", "install", "-y", "-q", "--no-install-recommends",
           "-o", "DPkg::Lock::Timeout=600", "shellcheck"]
    env = {**env_for_tests(), "DEBIAN_FRONTEND": "noninteractive"}
    log = ""
    for argv in (apt, ["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=600"], apt):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env,
                              stdin=subprocess.DEVNULL, check=False)
        log += proc.stdout + proc.stderr
        if argv is apt and proc.returncode == 0 and shutil.which("shellcheck"):
            break
    found = shutil.which("shellcheck")
    if found is None:
        pytest.fail(f"apt-get install shellcheck failed:\n{log[-3000:]}", pytrace=False)
    return found
